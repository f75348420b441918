package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ratemesh/ratemesh/httpapi"
)

const peersUsage = "usage: ratemesh peers [--api ADDR] [--json] [--token T] [--ca FILE] [--tls-cert FILE --tls-key FILE]\n       ratemesh peers evict PEER_ID [--api ADDR] [--json] [--token T] [--ca FILE] [--tls-cert FILE --tls-key FILE]"

// runPeers prints a node's member table (GET /v1/peers), or with `evict
// PEER_ID` removes a silent member at once (POST /v1/peers/{id}/evict).
func runPeers(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("peers", flag.ContinueOnError)
	setUsage(fset, stderr)
	api := fset.String("api", defaultAPI(os.Getenv), "the node's API, HOST:PORT or a URL (default $"+envName("api")+", else serve's own default)")
	asJSON := fset.Bool("json", false, "print only the node's JSON answer on stdout")
	timeout := fset.Duration("timeout", 10*time.Second, "give up after this long")
	auth := addClientAuth(fset)
	pos, err := parseInterspersed(fset, args)
	if err != nil {
		return flagExit(err)
	}
	bad := func(msg string) int {
		fmt.Fprintf(stderr, "ratemesh peers: %s\n%s\n", msg, peersUsage)
		return 2
	}
	evict := ""
	switch {
	case len(pos) == 0:
	case pos[0] == "evict" && len(pos) == 2 && pos[1] != "":
		evict = pos[1]
	case pos[0] == "evict":
		return bad("evict: takes exactly one PEER_ID")
	default:
		return bad(fmt.Sprintf("unknown argument %q", pos[0]))
	}
	c, err := auth.client(*api, 1, *timeout)
	if err != nil {
		return bad(err.Error())
	}
	base := c.base
	ctx := context.Background()
	if evict != "" {
		var resp struct{}
		if err := c.call(ctx, "POST", "/v1/peers/"+url.PathEscape(evict)+"/evict", nil, &resp); err != nil {
			fmt.Fprintf(stderr, "ratemesh peers evict %s: %s: %v\n", evict, base, err)
			return 1
		}
		if *asJSON {
			_ = writeJSON(stdout, resp)
		} else {
			fmt.Fprintf(stdout, "evicted %s\n", evict)
		}
		return 0
	}
	var resp httpapi.PeersResponse
	if err := c.call(ctx, "GET", "/v1/peers", nil, &resp); err != nil {
		fmt.Fprintf(stderr, "ratemesh peers: %s: %v\n", base, err)
		return 1
	}
	if *asJSON {
		if err := writeJSON(stdout, resp); err != nil {
			fmt.Fprintf(stderr, "ratemesh peers: %v\n", err)
			return 1
		}
		return 0
	}
	writePeers(stdout, resp.Peers)
	return 0
}

// writePeers prints the member table: one row per member, this node marked
// with *, then a count by state.
func writePeers(w io.Writer, ps []httpapi.PeerJSON) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tPEER ID\tSTATE\tINCARNATION\tLAST SEEN\tRULES\tADDRS")
	counts := map[string]int{}
	for _, p := range ps {
		self, seen := "", (time.Duration(p.LastSeenMs) * time.Millisecond).String()
		if p.Self {
			self, seen = "*", "-"
		}
		rules := "same"
		if !p.RulesMatch {
			rules = "DIFFER " + p.RulesHash
		}
		addrs := strings.Join(p.Addrs, " ")
		if addrs == "" {
			addrs = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", self, p.PeerID, p.State, p.Incarnation, seen, rules, addrs)
		counts[p.State]++
	}
	_ = tw.Flush()
	var parts []string
	for _, s := range []string{"alive", "suspect", "dead", "left"} {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
		}
	}
	fmt.Fprintf(w, "%d members: %s\n", len(ps), strings.Join(parts, ", "))
}
