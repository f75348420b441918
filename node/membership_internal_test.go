package node

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

func newTable(states map[string]State) *membership {
	ms := newMembership()
	peers := make([]string, 0, len(states))
	for p := range states {
		peers = append(peers, p)
	}
	slices.Sort(peers)
	slices.Reverse(peers) // add out of order: add keeps order sorted
	for _, p := range peers {
		ms.add(&member{peer: p, inc: 1, state: states[p]})
	}
	return &ms
}

// TestMembershipRecount checks the counts every decision uses, self ("m")
// counted alive, under both policies.
func TestMembershipRecount(t *testing.T) {
	tests := []struct {
		states        map[string]State
		policy        Policy
		n, alive, rk  int
		scale         float64
		fenced        bool
		majority, hlf bool
	}{
		{map[string]State{}, Strict, 1, 1, 0, 1, false, true, false},
		{map[string]State{"a": Alive, "z": Alive}, Strict, 3, 3, 1, 1, false, true, false},
		{map[string]State{"a": Alive, "b": Suspect, "z": Dead}, Strict, 3, 2, 2, 2.0 / 3, false, true, false},
		{map[string]State{"a": Suspect, "b": Suspect}, Strict, 3, 1, 2, 1.0 / 3, true, false, false},
		{map[string]State{"a": Suspect, "z": Alive, "q": Left}, Strict, 3, 2, 1, 2.0 / 3, false, true, false},
		{map[string]State{"a": Suspect}, Strict, 2, 1, 1, 0.5, false, false, true},
		{map[string]State{"a": Suspect, "b": Suspect}, Available, 3, 1, 2, 1, false, false, false},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			ms := newTable(tt.states)
			if !slices.IsSortedFunc(ms.order, func(a, b *member) int { return strings.Compare(a.peer, b.peer) }) || len(ms.order) != len(ms.byPeer) {
				t.Fatalf("order %v is not the sorted table", ms.order)
			}
			ms.recount("m", tt.policy)
			if ms.n != tt.n || ms.nAlive != tt.alive || ms.rank != tt.rk || ms.scale != tt.scale || ms.fenced != tt.fenced {
				t.Errorf("n %d alive %d rank %d scale %v fenced %v; want %d %d %d %v %v", ms.n, ms.nAlive, ms.rank, ms.scale, ms.fenced, tt.n, tt.alive, tt.rk, tt.scale, tt.fenced)
			}
			if ms.majority() != tt.majority || ms.half() != tt.hlf {
				t.Errorf("majority %v half %v; want %v %v", ms.majority(), ms.half(), tt.majority, tt.hlf)
			}
		})
	}
}

func TestMembershipChangesAndFence(t *testing.T) {
	ms := newTable(map[string]State{"a": Alive, "b": Alive})
	ms.changes = nil
	a, b := ms.byPeer["a"], ms.byPeer["b"]
	if ms.set(a, Alive) || len(ms.changes) != 0 {
		t.Fatal("setting the same state recorded a change")
	}
	ms.set(a, Suspect)
	ms.set(b, Suspect)
	ms.recount("m", Strict)
	want := []MemberChange{{Peer: "a", Incarnation: 1, From: Alive, To: Suspect}, {Peer: "b", Incarnation: 1, From: Alive, To: Suspect}}
	if !slices.Equal(ms.changes, want) {
		t.Errorf("changes %v, want %v", ms.changes, want)
	}
	if f := ms.fenceChange(); f == nil || *f != (FenceChange{Fenced: true, Alive: 1, Live: 3}) {
		t.Errorf("fenceChange = %+v, want fenced with 1 of 3 alive", f)
	}
	if f := ms.fenceChange(); f != nil {
		t.Errorf("fenceChange again = %+v, want nil: nothing changed", f)
	}
	ms.set(a, Alive)
	ms.recount("m", Strict)
	if f := ms.fenceChange(); f == nil || f.Fenced {
		t.Errorf("fenceChange after a member came back = %+v, want lifted", f)
	}
	ms.restart(b, 7)
	if b.inc != 7 || b.state != Alive || b.seqKnown {
		t.Errorf("after restart: inc %d state %v seqKnown %v; want 7, alive, false", b.inc, b.state, b.seqKnown)
	}
	if last := ms.changes[len(ms.changes)-1]; last != (MemberChange{Peer: "b", Incarnation: 7, From: Suspect, To: Alive, New: true}) {
		t.Errorf("restart recorded %+v", last)
	}
}

func TestMembershipLiveByRankAndEvictions(t *testing.T) {
	ms := newTable(map[string]State{"a": Alive, "c": Suspect, "d": Dead, "x": Alive})
	ms.recount("m", Strict)
	var got []string
	for _, m := range ms.liveByRank("m") {
		if m == nil {
			got = append(got, "self")
		} else {
			got = append(got, m.peer)
		}
	}
	if !slices.Equal(got, []string{"a", "c", "self", "x"}) {
		t.Errorf("liveByRank = %v, want [a c self x]", got)
	}
	ms.evictions = []eviction{{at: tIn}, {at: tIn.Add(30 * time.Second)}}
	ms.forgetEvictions(tIn.Add(evictMemory))
	if len(ms.evictions) != 1 || !ms.evictions[0].at.Equal(tIn.Add(30*time.Second)) {
		t.Errorf("after evictMemory: %v, want the later eviction only", ms.evictions)
	}
}

// TestReclaimScale checks the scale a reclaim keeps: windows that began
// before it keep the scale of before, later ones do not, and it ends once
// the longest window that began before it has ended.
func TestReclaimScale(t *testing.T) {
	fixed := limiter.Rule{Name: "f", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second}
	sliding := limiter.Rule{Name: "s", Algorithm: limiter.SlidingWindow, Limit: 10, Window: time.Second}
	conc := limiter.Rule{Name: "c", Algorithm: limiter.Concurrency, Limit: 10}
	for _, r := range []*limiter.Rule{&fixed, &sliding, &conc} {
		if err := r.Normalize(); err != nil {
			t.Fatal(err)
		}
	}
	var h reclaimScale
	h.start(10_500, 0.5)
	h.start(10_700, 0.75) // a second reclaim keeps the lower scale
	if h.fromMs != 10_700 || h.scale != 0.5 {
		t.Fatalf("scale kept from %d at %v, want 10700 at 0.5", h.fromMs, h.scale)
	}
	tests := []struct {
		r     *limiter.Rule
		nowMs int64
		want  float64
	}{
		{&fixed, 10_900, 0.5},   // its window began at 10,000
		{&fixed, 11_100, 1},     // a window that began after the reclaim
		{&sliding, 11_100, 0.5}, // the previous window (10,000) still weighs
		{&sliding, 12_000, 1},
		{&conc, 10_900, 1}, // leases of the evicted stop counting at once
	}
	for _, tt := range tests {
		env := limiter.Env{NowMs: tt.nowMs, Scale: 1}
		h.apply(tt.r, &env)
		if env.Scale != tt.want {
			t.Errorf("%s at %d: scale %v, want %v", tt.r.Name, tt.nowMs, env.Scale, tt.want)
		}
	}
	h.end(12_699, 1000)
	if h.fromMs == 0 {
		t.Fatal("the kept scale ended before two windows had passed")
	}
	h.end(12_700, 1000)
	if h.fromMs != 0 {
		t.Error("the kept scale did not end once two windows had passed")
	}
}
