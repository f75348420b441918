// Command bench runs ratemesh and Gubernator v2.13.0 side by side on
// loopback, one load generator against both in interleaved rounds, and
// prints min / median / max over the rounds and the ratios (issue 28):
//
//	cd bench && go run . --quick     # about two minutes once built
//	cd bench && go run .             # the full mode
//	cd bench && go run . --help
//
// It is a module of its own so that the main module does not depend on
// Gubernator; ./gubernator, another module, builds Gubernator's daemon on
// its own dependency versions. docs/performance.md ("Side by side with
// Gubernator") has the figures of real runs.
//
// Exit status: 0 when every scenario ran, 1 when one failed, 2 on bad
// flags, 130 when interrupted (SIGINT, SIGTERM). Every process it starts
// is killed before it exits, and should it die, by the kernel
// (Pdeathsig).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o, args, stderr)
	status := 0
	switch {
	case ctx.Err() != nil:
		rep.Interrupted, status = true, 130
	case err != nil:
		rep.Error, status = err.Error(), 1
		fmt.Fprintf(stderr, "bench: %v\n", err)
	}
	rep.Summary = summarize(rep, o)
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 1
		}
	} else {
		rep.writeText(stdout)
	}
	return status
}
