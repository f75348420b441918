// Package manifest_test checks deploy/kubernetes against the Kubernetes
// API types and against ratemesh's flags and defaults. It is a module of
// its own so that the ratemesh module does not depend on k8s.io; run it
// with
//
//	cd deploy/kubernetes/manifest_test && go test ./...
package manifest_test
