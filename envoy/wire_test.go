package envoy_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratemesh/ratemesh/envoy"
)

// TestFramesPerCall calls ShouldRateLimit over a bare HTTP/2 connection,
// one call at a time, acknowledging every PING at once as Envoy does,
// and counts what the server sends besides the answers: no PING and no
// WINDOW_UPDATE but the connection's at the start. (With grpc-go's BDP
// estimator on, the server sent a PING and a WINDOW_UPDATE with every
// answer here: see streamWindow.)
func TestFramesPerCall(t *testing.T) {
	desc, err := envoy.Parse(envoy.File{Name: "wire.yaml", Data: []byte("domain: wire\ndescriptors:\n  - key: key\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n")})
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, desc)
	conn, err := net.Dial("tcp", serveLoopback(t, f.srv))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	bw := bufio.NewWriter(conn)
	fr := http2.NewFramer(bw, bufio.NewReader(conn))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := bw.WriteString(http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	body, err := proto.Marshal(req("wire", [][][2]string{{{"key", "k1"}}}, 1))
	if err != nil {
		t.Fatal(err)
	}
	msg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
	msg = append(msg, body...)
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	for _, h := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/" + envoy.ServiceName + "/ShouldRateLimit"},
		{":authority", "ratemesh"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]}); err != nil {
			t.Fatal(err)
		}
	}
	const calls = 50
	var pings, updates int
	for i := range calls {
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteData(id, true, msg); err != nil {
			t.Fatal(err)
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		for done := false; !done; {
			fm, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			switch fm := fm.(type) {
			case *http2.SettingsFrame:
				if !fm.IsAck() {
					if err := fr.WriteSettingsAck(); err != nil {
						t.Fatal(err)
					}
				}
			case *http2.PingFrame:
				if !fm.IsAck() {
					pings++
					if err := fr.WritePing(true, fm.Data); err != nil {
						t.Fatal(err)
					}
				}
			case *http2.WindowUpdateFrame:
				updates++
			case *http2.MetaHeadersFrame:
				if fm.StreamEnded() {
					if s := fm.PseudoValue("status"); s != "" || fm.Header().StreamID != id {
						t.Fatalf("call %d: trailers-only answer or another stream: %v", i, fm.Fields)
					}
					for _, h := range fm.Fields {
						if h.Name == "grpc-status" && h.Value != "0" {
							t.Fatalf("call %d: %v", i, fm.Fields)
						}
					}
					done = true
				}
			case *http2.DataFrame:
				var resp rlspb.RateLimitResponse
				if d := fm.Data(); len(d) < 5 || proto.Unmarshal(d[5:], &resp) != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
					t.Fatalf("call %d: answer %x", i, d)
				}
			case *http2.GoAwayFrame, *http2.RSTStreamFrame:
				t.Fatalf("call %d: %v", i, fm)
			}
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if pings > 0 || updates > 1 {
		t.Errorf("%d calls: the server sent %d PINGs and %d WINDOW_UPDATEs; want none, and one at most (the connection's window at the start)", calls, pings, updates)
	}
}
