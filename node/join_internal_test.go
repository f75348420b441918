package node

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestJoinWaitsForEveryExpectedRelay checks the join: it waits for the
// relay of every peer it expects, ignores expectations of itself and of
// peers already heard, and reports the join once.
func TestJoinWaitsForEveryExpectedRelay(t *testing.T) {
	j := joinState{started: tIn}
	j.expect("me", "a")
	j.expect("me", "b")
	j.expect("me", "me")
	j.relayed("a")
	if j.joined {
		t.Fatal("joined with b's relay still expected")
	}
	j.expect("me", "a") // heard already: nothing more to wait for
	j.relayed("b")
	if !j.joined || !j.became || j.timedOut || j.stateFrom != nil || j.expecting != nil {
		t.Fatalf("after every relay: %+v, want joined (not timed out) with nothing outstanding", j)
	}
	j.expect("me", "c") // joined: expects nothing any more
	if j.expecting != nil {
		t.Errorf("a joined member expects %v", j.expecting)
	}
}

func TestJoinTimesOut(t *testing.T) {
	j := joinState{started: tIn}
	j.expect("me", "a")
	const timeout = 3 * time.Second
	if j.tick(tIn.Add(timeout-time.Millisecond), timeout) || j.joined {
		t.Fatal("joined before join_timeout")
	}
	if left := j.left(tIn.Add(time.Second), timeout); left != 2*time.Second {
		t.Errorf("left after 1 s = %v, want 2s", left)
	}
	if !j.tick(tIn.Add(timeout), timeout) || !j.joined || !j.became || !j.timedOut {
		t.Fatalf("at join_timeout: %+v, want joined by timeout", j)
	}
	if j.tick(tIn.Add(2*timeout), timeout) {
		t.Error("joined twice")
	}
}

// TestJoinRejoinsWhenTheFenceLifts checks the rejoin: members heard again
// while fenced whose relay has not arrived are expected again once the
// fence lifts; one whose relay arrived, or that is no longer alive, is
// not.
func TestJoinRejoinsWhenTheFenceLifts(t *testing.T) {
	j := joinState{started: tIn, joined: true}
	alive := func(p string) bool { return p != "gone" }
	none := func() []string { return nil }
	now := tIn.Add(time.Minute)
	if j.fence(now, true, "me", alive, none) {
		t.Fatal("fencing made the member rejoin")
	}
	j.heard("a")
	j.heard("b")
	j.heard("gone")
	j.relayed("b")
	if !j.fence(now, false, "me", alive, none) {
		t.Fatal("the fence lifted with a's relay missing and the member still serves")
	}
	if j.joined || !j.started.Equal(now) || !j.expecting["a"] || len(j.expecting) != 1 {
		t.Errorf("after the fence lifted: joined %v, started %v, expecting %v; want joining since now, expecting a", j.joined, j.started, j.expecting)
	}
	if !slices.Equal(j.ask, []string{"a"}) {
		t.Errorf("asks %v for their relay, want a: nothing asked it, and nothing else would (its connection may never have dropped)", j.ask)
	}
	if j.fence(now, false, "me", alive, none) {
		t.Error("a second call without a fence rejoined again")
	}
	// A member asked for its relay already (a full state flagged
	// FlagWant went to it on a new connection) is awaited, not asked again.
	m := joinState{started: tIn, joined: true}
	m.fence(now, true, "me", alive, none)
	m.heard("a")
	m.asked = map[string]bool{"a": true}
	if !m.fence(now, false, "me", alive, none) || !m.expecting["a"] || len(m.ask) != 0 {
		t.Errorf("a asked already: expecting %v, asks %v; want a awaited and nobody asked again", m.expecting, m.ask)
	}
	// Every member heard again has sent its relay: the fence lifts
	// without a rejoin.
	k := joinState{started: tIn, joined: true}
	k.fence(now, true, "me", alive, none)
	k.heard("a")
	k.relayed("a")
	if k.fence(now, false, "me", alive, none) || !k.joined {
		t.Error("rejoined although every member heard again had sent its relay")
	}
	// A member still suspect when the fence lifts (its stream to us has
	// not restarted yet) is expected too: its full state says whether it
	// evicted us.
	l := joinState{started: tIn, joined: true}
	l.fence(now, true, "me", alive, none)
	l.heard("a")
	l.relayed("a")
	if !l.fence(now, false, "me", alive, func() []string { return []string{"a", "s"} }) || l.joined || !l.expecting["s"] || len(l.expecting) != 1 {
		t.Errorf("with s still suspect: joined %v, expecting %v; want rejoined, expecting s alone", l.joined, l.expecting)
	}
}

func TestJoinWantsOncePerPeer(t *testing.T) {
	var j joinState
	for _, p := range []string{"b", "a", "b"} {
		j.want(p)
	}
	if !slices.Equal(j.wants, []string{"b", "a"}) {
		t.Errorf("wants = %v, want [b a]", j.wants)
	}
}

// TestJoinSuggestionsAreBounded checks the suggested peers a joining member
// awaits: at most maxSuggestPerSender from one sender and maxSuggested in
// all, each until it is heard, and none once joined; the join waits for
// them after the relay has arrived.
func TestJoinSuggestionsAreBounded(t *testing.T) {
	j := joinState{started: tIn}
	for i := range 2 * maxSuggestPerSender {
		j.suggest("liar", fmt.Sprintf("p%d", i))
	}
	if len(j.suggested) != maxSuggestPerSender || j.perSender["liar"] != maxSuggestPerSender {
		t.Fatalf("one sender left %d suggestions (%d counted); want %d", len(j.suggested), j.perSender["liar"], maxSuggestPerSender)
	}
	for s := range 2 * maxSuggested / maxSuggestPerSender {
		for i := range maxSuggestPerSender {
			j.suggest(fmt.Sprintf("s%d", s), fmt.Sprintf("s%d-%d", s, i))
		}
	}
	if len(j.suggested) != maxSuggested {
		t.Fatalf("%d suggestions in all, want the cap %d", len(j.suggested), maxSuggested)
	}

	k := joinState{started: tIn}
	k.suggest("seed", "a")
	k.suggest("seed", "b")
	k.relayed("seed")
	if k.joined {
		t.Fatal("joined on the seed's relay with a and b unheard")
	}
	if k.heardFrom("a") || k.joined {
		t.Fatal("joined with b unheard")
	}
	if !k.heardFrom("b") || !k.joined || k.suggested != nil || k.perSender != nil {
		t.Fatalf("after hearing both: %+v; want joined, nothing kept", k)
	}
	if k.suggest("seed", "c") || k.suggested != nil {
		t.Error("a joined member keeps suggestions")
	}
}
