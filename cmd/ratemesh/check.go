package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ratemesh/ratemesh/httpapi"
)

const checkUsage = "usage: ratemesh check [--api ADDR] --rule NAME --key KEY [--cost N] [--type T --units N] [--class NAME] [--json] [--token T] [--ca FILE] [--tls-cert FILE --tls-key FILE]"

// runCheck asks one node whether a request may proceed (POST /v1/allow) and
// prints the decision. It exits 0 whenever the node answered, allowed or
// not (the answer says which), 1 when it could not ask or the node refused
// the request (the error names the field), 2 for bad flags.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("check", flag.ContinueOnError)
	setUsage(fset, stderr)
	api := fset.String("api", defaultAPI(os.Getenv), "the node's API, HOST:PORT or a URL (default $"+envName("api")+", else serve's own default)")
	rule := fset.String("rule", "", "the rule to check against")
	key := fset.String("key", "", "the key (account, API key, IP, …)")
	cost := fset.Uint64("cost", 1, "credits the request costs (0 is a peek that consumes nothing)")
	typ := fset.String("type", "", "a request type from the rule's costs (with --units)")
	units := fset.Uint64("units", 1, "units of --type")
	class := fset.String("class", "", "the client's class")
	asJSON := fset.Bool("json", false, "print only the node's JSON answer on stdout")
	timeout := fset.Duration("timeout", 10*time.Second, "give up after this long")
	auth := addClientAuth(fset)
	if err := fset.Parse(args); err != nil {
		return flagExit(err)
	}
	set := map[string]bool{}
	fset.Visit(func(f *flag.Flag) { set[f.Name] = true })
	bad := func(msg string) int {
		fmt.Fprintf(stderr, "ratemesh check: %s\n%s\n", msg, checkUsage)
		return 2
	}
	switch {
	case fset.NArg() > 0:
		return bad(fmt.Sprintf("unexpected argument %q", fset.Arg(0)))
	case *rule == "":
		return bad("--rule: required")
	case *key == "":
		return bad("--key: required")
	case set["cost"] && set["type"]:
		return bad("--cost and --type: give one, not both")
	case set["units"] && !set["type"]:
		return bad("--units: needs --type")
	}
	c, err := auth.client(*api, 1, *timeout)
	if err != nil {
		return bad(err.Error())
	}
	base := c.base
	req := httpapi.AllowRequest{Rule: *rule, Key: *key, Class: *class}
	if set["cost"] {
		req.Cost = cost
	}
	if set["type"] {
		req.Type, req.Units = *typ, units
	}
	var resp httpapi.AllowResponse
	if err := c.call(context.Background(), "POST", "/v1/allow", req, &resp); err != nil {
		fmt.Fprintf(stderr, "ratemesh check: %s: %v\n", base, err)
		return 1
	}
	if *asJSON {
		if err := writeJSON(stdout, resp); err != nil {
			fmt.Fprintf(stderr, "ratemesh check: %v\n", err)
			return 1
		}
		return 0
	}
	writeDecision(stdout, resp)
	return 0
}

// writeDecision prints an answer of /v1/allow for people.
func writeDecision(w io.Writer, r httpapi.AllowResponse) {
	reset := time.Duration(r.ResetAfterMs) * time.Millisecond
	if r.Allowed {
		fmt.Fprintf(w, "allowed: limit %d, remaining %d, window resets in %v\n", r.Limit, r.Remaining, reset)
		return
	}
	switch {
	case r.RetryAfterMs < 0:
		fmt.Fprintf(w, "denied: the cost exceeds the limit %d and can never be admitted\n", r.Limit)
	default:
		fmt.Fprintf(w, "denied: limit %d, remaining %d, retry after %v, window resets in %v (reason: %s)\n",
			r.Limit, r.Remaining, time.Duration(r.RetryAfterMs)*time.Millisecond, reset, r.Reason)
	}
}
