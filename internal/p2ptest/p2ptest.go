// Package p2ptest holds the libp2p fixtures that the tests of mesh and
// node/p2plimit share: hosts on loopback TCP and a gossipsub topic whose
// messages are recorded, standing for a service's own traffic beside
// ratemesh's.
package p2ptest

import (
	"context"
	"encoding/binary"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/ratemesh/ratemesh/crdt"
)

// Host returns a libp2p host listening on 127.0.0.1 (TCP, an ephemeral
// port, no relay), closed when the test ends.
func Host(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// Connect connects a to b within 5 s or fails the test.
func Connect(t testing.TB, a, b host.Host) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

// Topic is a joined gossipsub topic whose every received message is
// recorded until the test ends.
type Topic struct {
	*pubsub.Topic

	mu  sync.Mutex
	got map[string]bool
}

// Join joins and subscribes to the topic name on ps and records what
// arrives until the test ends.
func Join(t testing.TB, ps *pubsub.PubSub, name string) *Topic {
	t.Helper()
	topic, err := ps.Join(name)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := topic.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tp := &Topic{Topic: topic, got: map[string]bool{}}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			msg, err := sub.Next(ctx)
			if err != nil {
				return
			}
			tp.mu.Lock()
			tp.got[string(msg.Data)] = true
			tp.mu.Unlock()
		}
	}()
	return tp
}

// Received reports whether a message with data msg has arrived.
func (tp *Topic) Received(msg string) bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.got[msg]
}

// SendRawSync writes batches on a ratemesh sync stream (proto, e.g.
// mesh.Mesh.SyncProtocol) from h to `to` as the protocol frames them (a
// uvarint length, then the CBOR batch), closes its side and waits for the
// receiver to close the stream, its receipt; a reset is an error. It is
// what an adversary that speaks the protocol does by hand: a Mesh's own
// SendDirect fills in the addresses its peerstore knows for a member
// table's entries, and refuses nothing it is given.
func SendRawSync(ctx context.Context, h host.Host, to peer.ID, proto protocol.ID, batches ...*crdt.Batch) error {
	s, err := h.NewStream(ctx, to, proto)
	if err != nil {
		return err
	}
	defer s.Close()
	for _, b := range batches {
		data, err := b.Encode()
		if err != nil {
			return err
		}
		if _, err := s.Write(append(binary.AppendUvarint(nil, uint64(len(data))), data...)); err != nil {
			return err
		}
	}
	if err := s.CloseWrite(); err != nil {
		return err
	}
	_, err = io.ReadAll(s)
	return err
}
