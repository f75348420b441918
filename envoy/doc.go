// Package envoy makes a ratemesh node a drop-in for Envoy's external rate
// limit service: it loads envoyproxy/ratelimit's YAML configuration
// (domains and nested descriptors), generates the ratemesh rules that
// count them, and serves envoy.service.ratelimit.v3.RateLimitService over
// gRPC with the node's decisions, beside the standard gRPC health service.
//
// A daemon drives it like this:
//
//	desc, err := envoy.Load(path)             // a file or a directory of *.yaml
//	rules := append(fileRules, desc.Rules()...) // the node counts them like any rule
//	n, _ := node.Start(ctx, cfg)              // with rules
//	srv, _ := envoy.New(envoy.Config{Node: n, Descriptors: desc})
//	go srv.Serve(ln)
//	<-n.ReadyC()
//	srv.SetServing(true)
//	…
//	// on SIGHUP: load again, n.Reload(rules), srv.SetDescriptors(desc)
//
// envoyproxy/ratelimit is the reference for matching (key_value first,
// then wildcards, then the key alone; a limit applies only at the
// descriptor's last level), unlimited, shadow_mode, replaces and
// hits_addend. Each matched descriptor is one fixed window check of its
// entry's rule, keyed by the values the entry does not fix, so each value
// of a key without a value has its own counter, replicated by the mesh
// like any rule's.
package envoy
