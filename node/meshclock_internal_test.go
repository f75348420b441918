package node

import (
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

func clockCfg() *CoreConfig {
	cfg := DefaultCoreConfig()
	cfg.Peer = "me"
	return &cfg
}

// TestMeshClockMedian checks the offset: the median of the live members'
// estimates and our own 0, ignoring members without an estimate and
// members that are not live.
func TestMeshClockMedian(t *testing.T) {
	mk := func(st State, ms int64, has bool) *member {
		m := &member{state: st}
		m.clockMs, m.hasClock, m.caps = ms, has, capEcho
		return m
	}
	tests := []struct {
		name  string
		order []*member
		want  int64
	}{
		{"alone", nil, 0},
		{"odd", []*member{mk(Alive, 100, true), mk(Suspect, 300, true)}, 100},
		{"even", []*member{mk(Alive, 100, true), mk(Alive, 300, true), mk(Alive, 40, true)}, 70},
		{"dead and unknown left out", []*member{mk(Alive, 100, true), mk(Dead, -900, true), mk(Alive, 50, false)}, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newMeshClock(clockCfg(), tIn)
			k.update(tt.order)
			if k.offsetMs != tt.want {
				t.Errorf("offset %d ms, want %d", k.offsetMs, tt.want)
			}
			if got, want := k.meshMs(tIn), tIn.UnixMilli()+tt.want; got != want {
				t.Errorf("meshMs %d, want %d", got, want)
			}
		})
	}
	cfg := clockCfg()
	cfg.LocalClock = true
	k := newMeshClock(cfg, tIn)
	k.update([]*member{mk(Alive, 100, true)})
	if k.meshMs(tIn) != tIn.UnixMilli() {
		t.Error("LocalClock: mesh time is not the local clock")
	}
}

func TestMeshClockSkewChange(t *testing.T) {
	k := newMeshClock(clockCfg(), tIn) // max_skew 500 ms
	steps := []struct {
		offsetMs int64
		want     *SkewChange
	}{
		{400, nil},
		{-600, &SkewChange{Exceeded: true, Offset: -600 * time.Millisecond}},
		{700, nil}, // still beyond
		{500, &SkewChange{Exceeded: false, Offset: 500 * time.Millisecond}},
	}
	for i, s := range steps {
		k.offsetMs = s.offsetMs
		got := k.skewChange()
		if (got == nil) != (s.want == nil) || got != nil && *got != *s.want {
			t.Errorf("step %d (offset %d ms): skewChange %+v, want %+v", i, s.offsetMs, got, s.want)
		}
	}
}

// TestMeshClockEchoes checks the echo queue: members owing an echo are
// echoed one per batch, oldest first, and none while a live member has not
// announced FlagEcho.
func TestMeshClockEchoes(t *testing.T) {
	k := newMeshClock(clockCfg(), tIn)
	a := &member{peer: "a", state: Alive, tag: crdt.PeerTag("a")}
	b := &member{peer: "b", state: Alive, tag: crdt.PeerTag("b")}
	now := tIn
	k.step(now, a, &crdt.Batch{Clock: now.UnixMilli() + 50, Flags: crdt.FlagEcho})
	k.step(now, b, &crdt.Batch{Clock: now.UnixMilli() + 80})
	k.update([]*member{a, b})
	if k.all(capEcho) {
		t.Fatal("echoes on while b has not announced FlagEcho")
	}
	if es := k.takeEchoes(now.UnixMilli() + 5); es != nil {
		t.Fatalf("echoed %v while b cannot take echoes", es)
	}
	k.step(now, b, &crdt.Batch{Clock: now.UnixMilli() + 80, Flags: crdt.FlagEcho})
	k.update([]*member{a, b})
	sendMs := now.UnixMilli() + 5
	es := k.takeEchoes(sendMs)
	if len(es) != 1 || es[0].Peer != a.tag || es[0].Held != 5 || es[0].Ago != sendMs-(now.UnixMilli()+50) {
		t.Fatalf("first batch echoes %+v, want a's clock held 5 ms", es)
	}
	es = k.takeEchoes(sendMs)
	if len(es) != 1 || es[0].Peer != b.tag {
		t.Fatalf("second batch echoes %+v, want b's", es)
	}
	if es := k.takeEchoes(sendMs); es != nil || len(k.echoQ) != 0 {
		t.Errorf("third batch echoes %+v with %d queued, want nothing owed", es, len(k.echoQ))
	}
}
