package mesh

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/node"
)

// latencies collects one-way delays; Sent carries the publish instant in
// Unix nanoseconds (the hosts share a clock).
type latencies struct {
	mu   sync.Mutex
	ds   []time.Duration
	keys map[string]int
}

func (l *latencies) add(d time.Duration, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ds = append(l.ds, d)
	if l.keys == nil {
		l.keys = map[string]int{}
	}
	l.keys[key]++
}

func (l *latencies) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keys[key]
}

func (l *latencies) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ds, l.keys = nil, nil
}

func (l *latencies) summary() (n int, p50, p99, max time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ds := slices.Clone(l.ds)
	slices.Sort(ds)
	if len(ds) == 0 {
		return 0, 0, 0, 0
	}
	return len(ds), ds[len(ds)/2], ds[(len(ds)*99)/100], ds[len(ds)-1]
}

type latencyHandler struct{ l *latencies }

func (h latencyHandler) HandleBatch(in node.Inbound) {
	h.l.add(time.Since(time.Unix(0, in.Batch.Sent)), in.Batch.Windows[0].Key)
}
func (h latencyHandler) PeerConnected(string) {}

// TestPropagationFigures measures, among five loopback members in a full
// mesh (each dials every earlier one, as members do once they have
// learnt of each other) publishing every 20 ms, the delay from Publish to
// HandleBatch, and compares it with raw gossipsub between the same hosts
// and routers (a second topic with no validator and no decoding). It logs
// the figures and asserts only that every message arrived. Run it without
// -race for representative numbers:
//
//	go test -run TestPropagationFigures -v ./mesh/
func TestPropagationFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	const (
		n       = 5
		every   = 20 * time.Millisecond
		perPeer = 50
	)
	lat := &latencies{}
	ms := make([]*Mesh, n)
	for i := range n {
		cfg := testConfig(t)
		cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
		// Not a star: the hub of a star relays to at most GossipDhi of
		// its leaves, and without a node runtime the leaves never dial
		// each other.
		for _, o := range ms[:i] {
			cfg.Bootstrap = append(cfg.Bootstrap, tcpAddr(t, o))
		}
		ms[i] = newMesh(t, cfg)
		if err := ms[i].Start(context.Background(), latencyHandler{lat}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()

	// Raw gossipsub on the same routers: another topic, no validator.
	rawLat, rawTopics := joinRaw(t, ms, nil)

	mk := func(i int, key string) *crdt.Batch {
		b := batch(ms[i].PeerID(), 1, key, 1)
		b.Sent = time.Now().UnixNano()
		return b
	}
	rawMsg := func(key string) []byte {
		var hdr [8]byte
		binary.BigEndian.PutUint64(hdr[:], uint64(time.Now().UnixNano()))
		return append(hdr[:], key...)
	}
	// Warm up until both topic meshes have formed: some round's messages
	// reached everyone.
	round := 0
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		round++
		for i, m := range ms {
			key := fmt.Sprintf("warm-%d-%d", i, round)
			if err := m.Publish(ctx, mk(i, key)); err != nil {
				t.Fatal(err)
			}
			if err := rawTopics[i].Publish(ctx, rawMsg(key)); err != nil {
				t.Fatal(err)
			}
		}
	rounds:
		for r := max(1, round-5); r < round; r++ {
			for i := range ms {
				key := fmt.Sprintf("warm-%d-%d", i, r)
				if lat.count(key) < n-1 || rawLat.count(key) < n-1 {
					continue rounds
				}
			}
			return true, "topic meshes formed"
		}
		return false, "topic meshes formed"
	})

	// Both kinds go out in the same ticks, in alternating order, so they
	// meet the same load (this machine is shared).
	lat.reset()
	rawLat.reset()
	var wireBefore uint64
	for _, m := range ms {
		wireBefore += m.Stats().GossipWireOut
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for k := range perPeer {
				<-tick.C
				key := fmt.Sprintf("m-%d-%d", i, k)
				pubMesh := func() error { return ms[i].Publish(ctx, mk(i, key)) }
				pubRaw := func() error { return rawTopics[i].Publish(ctx, rawMsg(key)) }
				first, second := pubMesh, pubRaw
				if (i+k)%2 == 1 {
					first, second = pubRaw, pubMesh
				}
				if err := first(); err != nil {
					t.Error(err)
					return
				}
				if err := second(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	want := n * perPeer * (n - 1)
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		a, _, _, _ := lat.summary()
		b, _, _, _ := rawLat.summary()
		return a >= want && b >= want, "every message delivered"
	})
	var wireAfter uint64
	for _, m := range ms {
		wireAfter += m.Stats().GossipWireOut
	}
	for _, x := range []struct {
		name string
		l    *latencies
	}{{"ratemesh", lat}, {"raw", rawLat}} {
		got, p50, p99, worst := x.l.summary()
		t.Logf("%-8s %d deliveries: p50 %v  p99 %v  max %v", x.name, got, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), worst.Round(10*time.Microsecond))
	}
	size := len(encode(t, mk(0, "m-0-0")))
	t.Logf("one-entry batch %d bytes; gossipsub bytes sent by all members per published message (both kinds, every copy, signatures, control): %d",
		size, (wireAfter-wireBefore)/uint64(2*n*perPeer))
}

// TestBytesPerEntry logs the encoded size of a batch per changed entry for
// batches of 1, 10 and 100 entries shaped like real traffic: a real peer
// ID, a rule name, account keys, current window indices and counts.
func TestBytesPerEntry(t *testing.T) {
	t.Parallel()
	peerID := "12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf"
	now := int64(1_763_780_000_000)
	for _, entries := range []int{1, 10, 100} {
		b := &crdt.Batch{
			Version: crdt.Version, From: crdt.Slot{Peer: peerID, Incarnation: uint64(now)},
			Seq: 123456, Sent: now, Clock: now + 3, RulesHash: 0x9e3779b97f4a7c15, Ack: now - 20,
		}
		for i := range entries {
			b.Windows = append(b.Windows, crdt.WindowEntry{
				Rule: "api", Key: fmt.Sprintf("acct:%06d", 100000+i*7919%900000),
				WindowMs: 1000, Window: now / 1000, Admitted: uint64(37 + i%50), Attempted: uint64(40 + i%50 + i%7),
			})
		}
		data := encode(t, b)
		t.Logf("%3d entries: %5d bytes, %6.1f bytes/entry", entries, len(data), float64(len(data))/float64(entries))
		if entries == 100 && len(data)/entries > 64 {
			t.Errorf("%d bytes per entry at 100 entries: the header should amortise away", len(data)/entries)
		}
	}
}

// joinRaw joins every mesh's router to a plain gossipsub topic (no
// validator), the reference the figures compare with: it records the
// latency of every message another member published there, unless skip
// says to leave its key out. A message's data is its send time (8 bytes,
// unix ns) followed by its key.
func joinRaw(t *testing.T, ms []*Mesh, skip func(key string) bool) (*latencies, []*pubsub.Topic) {
	t.Helper()
	lat := &latencies{}
	topics := make([]*pubsub.Topic, len(ms))
	for i, m := range ms {
		tp, err := m.ps.Join("/ratemesh-bench/raw")
		if err != nil {
			t.Fatal(err)
		}
		sub, err := tp.Subscribe(pubsub.WithBufferSize(1024))
		if err != nil {
			t.Fatal(err)
		}
		topics[i] = tp
		self := m.Host().ID()
		go func() {
			for {
				msg, err := sub.Next(m.ctx)
				if err != nil {
					return
				}
				if msg.GetFrom() == self {
					continue
				}
				sent := int64(binary.BigEndian.Uint64(msg.Data[:8]))
				key := string(msg.Data[8:])
				if skip != nil && skip(key) {
					continue
				}
				lat.add(time.Since(time.Unix(0, sent)), key)
			}
		}()
	}
	return lat, topics
}
