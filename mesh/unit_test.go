package mesh

import (
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	const min, max = 250 * time.Millisecond, 30 * time.Second
	for _, tc := range []struct {
		n    int
		u    float64
		want time.Duration
	}{
		{0, 0, 125 * time.Millisecond}, // jitter floor is half
		{0, 0.999999, 250 * time.Millisecond},
		{1, 0, 250 * time.Millisecond},
		{2, 0.5, 750 * time.Millisecond}, // 1 s × 0.75
		{7, 0, 15 * time.Second},         // 250 ms × 2⁷ = 32 s, capped at 30 s
		{7, 0.999999, 30 * time.Second},
		{50, 0, 15 * time.Second}, // never overflows
	} {
		got := backoff(tc.n, min, max, tc.u)
		if d := got - tc.want; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("backoff(%d, u=%v) = %v, want %v", tc.n, tc.u, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	for _, tc := range []struct {
		field string
		edit  func(*Config)
	}{
		{"Namespace", func(c *Config) { c.Namespace = "" }},
		{"Namespace", func(c *Config) { c.Namespace = "a/b" }},
		{"PrivKey", func(c *Config) { c.PrivKey = nil }},
		{"PSK", func(c *Config) { c.PSK = make([]byte, 31) }},
		{"Listen[0]", func(c *Config) { c.Listen = []string{"not a multiaddr"} }},
		{"Listen[0]", func(c *Config) { c.Listen = []string{"/ip4/127.0.0.1/udp/4001"} }},
		{"Bootstrap[1]", func(c *Config) {
			c.Bootstrap = []string{"/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf", "/ip4/127.0.0.1/tcp/4001"}
		}},
		{"MaxMessageBytes", func(c *Config) { c.MaxMessageBytes = crdt.MaxBatchBytes + 1 }},
		{"DialTimeout", func(c *Config) { c.DialTimeout = 0 }},
		{"SyncTimeout", func(c *Config) { c.SyncTimeout = -1 }},
		{"MaxSyncBatches", func(c *Config) { c.MaxSyncBatches = 0 }},
		{"QueueSize", func(c *Config) { c.QueueSize = 0 }},
		{"GossipHeartbeat", func(c *Config) { c.GossipHeartbeat = time.Millisecond }},
		{"RedialMin", func(c *Config) { c.RedialMin = 0 }},
		{"RedialMax", func(c *Config) { c.RedialMax = time.Millisecond }},
	} {
		cfg := DefaultConfig()
		cfg.PrivKey = key
		tc.edit(&cfg)
		err := cfg.validate()
		if err == nil || !strings.Contains(err.Error(), "config "+tc.field+":") {
			t.Errorf("%s: got %v, want an error naming the field", tc.field, err)
		}
	}
	cfg := DefaultConfig()
	cfg.PrivKey = key
	if err := cfg.validate(); err != nil {
		t.Errorf("DefaultConfig with a key: %v", err)
	}
}

func TestCheckBatch(t *testing.T) {
	t.Parallel()
	const author = "12D3KooWAuthor"
	plausible := func(rule string) (uint64, bool) {
		if rule == "api" {
			return 100, true
		}
		return 0, false
	}
	withLease := func(acq, rel uint64) *crdt.Batch {
		b := batch(author, 1, "k", 1)
		b.Leases = []crdt.LeaseEntry{{Rule: "api", Key: "k", Acquired: acq, Released: rel}}
		return b
	}
	foreign := func(lease bool) *crdt.Batch {
		b := batch(author, 1, "k", 1)
		b.Slots = []crdt.Slot{{Peer: "12D3KooWOther", Incarnation: 1}}
		if lease {
			b.Leases = []crdt.LeaseEntry{{Slot: 1, Rule: "api", Key: "k", Acquired: 1}}
		} else {
			b.Windows[0].Slot = 1
		}
		return b
	}
	unknownRule := batch(author, 1, "k", 1<<40)
	unknownRule.Windows[0].Rule = "other"
	manyAttempts := batch(author, 1, "k", 100)
	manyAttempts.Windows[0].Attempted = 1 << 40 // rejections are not bounded
	relayedOver := foreign(false)
	relayedOver.Windows[0].Admitted, relayedOver.Windows[0].Attempted = 101, 101
	members := batch(author, 1, "k", 1)
	members.Flags |= crdt.FlagFull
	members.Members = []crdt.MemberEntry{{Peer: "12D3KooWOther", Incarnation: 1}}
	for _, tc := range []struct {
		name      string
		b         *crdt.Batch
		plausible func(string) (uint64, bool)
		relay     bool
		ok        bool
		reason    Reason
	}{
		{"honest", batch(author, 1, "k", 100), plausible, false, true, 0},
		{"other author", batch("12D3KooWOther", 1, "k", 1), plausible, false, false, ReasonAuthor},
		{"foreign window slot", foreign(false), plausible, false, false, ReasonForeignSlot},
		{"foreign lease slot", foreign(true), plausible, false, false, ReasonForeignSlot},
		{"relayed window slot", foreign(false), plausible, true, true, 0},
		{"relayed lease slot", foreign(true), plausible, true, true, 0},
		{"relayed over bound", relayedOver, plausible, true, false, ReasonImplausible},
		{"relayed other author", batch("12D3KooWOther", 1, "k", 1), plausible, true, false, ReasonAuthor},
		{"member table in gossip", members, plausible, false, false, ReasonForeignSlot},
		{"member table relayed", members, plausible, true, true, 0},
		{"admitted over bound", batch(author, 1, "k", 101), plausible, false, false, ReasonImplausible},
		{"attempted unbounded", manyAttempts, plausible, false, true, 0},
		{"unknown rule unchecked", unknownRule, plausible, false, true, 0},
		{"no bound at all", batch(author, 1, "k", 1<<50), nil, false, true, 0},
		{"live leases at bound", withLease(1000, 900), plausible, false, true, 0},
		{"live leases over bound", withLease(1000, 899), plausible, false, false, ReasonImplausible},
	} {
		reason, err := checkBatch(tc.b, author, tc.plausible, tc.relay)
		if (err == nil) != tc.ok || (!tc.ok && reason != tc.reason) {
			t.Errorf("%s: got %v %v, want ok=%v reason %v", tc.name, reason, err, tc.ok, tc.reason)
		}
	}
}

func TestMDNSServiceName(t *testing.T) {
	t.Parallel()
	a, b := mdnsService("default"), mdnsService("other")
	if a == b {
		t.Error("two namespaces share an mDNS service")
	}
	label := strings.TrimSuffix(a, "._udp")
	if len(label) > 16 || !strings.HasPrefix(label, "_") {
		t.Errorf("service %q: label %q too long for DNS-SD", a, label)
	}
}

func TestReasonString(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for r := range NumReasons {
		s := r.String()
		if strings.HasPrefix(s, "reason(") || seen[s] {
			t.Errorf("reason %d has no distinct label: %q", int(r), s)
		}
		seen[s] = true
	}
}
