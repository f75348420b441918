package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// grpcServerEnv makes the test binary BenchmarkGRPCClient's server.
const grpcServerEnv = "BENCH_GRPC_TEST_SERVER"

// TestMain runs the tests, or, with grpcServerEnv=1, serves the test
// server's methods (handleTestCall) with grpc-go on 127.0.0.1, prints
// the address and serves until its stdin closes.
func TestMain(m *testing.M) {
	if os.Getenv(grpcServerEnv) == "1" {
		os.Exit(serveGRPCChild())
	}
	os.Exit(m.Run())
}

func serveGRPCChild() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(handleTestCall(nil)))
	go func() { _ = srv.Serve(ln) }()
	fmt.Println(ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Stop()
	return 0
}

// startGRPCChild starts the test binary as a gRPC server and returns its
// address and PID; it stops with the benchmark.
func startGRPCChild(b *testing.B) (string, int) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), grpcServerEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("the server child: %v", err)
	}
	return strings.TrimSpace(line), cmd.Process.Pid
}

// BenchmarkGRPCClient measures the CPU one unary call costs the load
// generator with grpcConn and with grpc-go's client as the harness used
// it before (a grpc.ClientConn per worker, Invoke through rawCodec): 64
// workers, each with its own connection and one call in flight, against
// grpc-go's server (the tests' handler) in a child process, so that this
// process's CPU is the client's alone. client-cpu-ns/op is this
// process's CPU a call (getrusage), server-cpu-ns/op the child's
// (/proc, 10 ms ticks: run for seconds). The message is a
// GetRateLimits request of one key, echoed.
func BenchmarkGRPCClient(b *testing.B) {
	addr, pid := startGRPCChild(b)
	req := guberRequest(tputLimit, "k1234")
	const workers = 64
	type caller func(ctx context.Context) error
	for _, c := range []struct {
		name string
		dial func() (caller, func(), error)
	}{
		{"grpcConn", func() (caller, func(), error) {
			g := &grpcConn{addr: addr}
			var resp bytes.Buffer
			return func(ctx context.Context) error {
				if err := g.call(ctx, echoMethod, req, &resp, requestTimeout); err != nil {
					return err
				}
				if resp.Len() != len(req) {
					return fmt.Errorf("an answer of %d bytes, want %d", resp.Len(), len(req))
				}
				return nil
			}, g.close, nil
		}},
		{"grpc-go", func() (caller, func(), error) {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, nil, err
			}
			r := req
			var resp []byte
			return func(ctx context.Context) error {
				if err := conn.Invoke(ctx, echoMethod, &r, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
					return err
				}
				if len(resp) != len(req) {
					return fmt.Errorf("an answer of %d bytes, want %d", len(resp), len(req))
				}
				return nil
			}, func() { _ = conn.Close() }, nil
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background()) // as a phase's
			defer cancel()
			par := max(1, workers/runtime.GOMAXPROCS(0))
			n := par * runtime.GOMAXPROCS(0) // RunParallel's goroutines: 64 on 2 CPUs
			pool := make(chan caller, n)
			for range n {
				call, closeFn, err := c.dial()
				if err != nil {
					b.Fatal(err)
				}
				defer closeFn()
				if err := call(ctx); err != nil { // connected, warm
					b.Fatal(err)
				}
				pool <- call
			}
			b.SetParallelism(par)
			self0, srv0 := selfCPU(), childCPU(b, pid)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				call := <-pool
				for pb.Next() {
					if err := call(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			self, srv := selfCPU()-self0, childCPU(b, pid)-srv0
			b.ReportMetric(float64(self.Nanoseconds())/float64(b.N), "client-cpu-ns/op")
			b.ReportMetric(float64(srv.Nanoseconds())/float64(b.N), "server-cpu-ns/op")
		})
	}
}

func childCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	d, err := procCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
