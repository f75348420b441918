// Package nodetest is an in-memory network for node cores driven on virtual
// time, for tests: it delivers every published batch to every reachable
// member after a delay, and can drop, delay, duplicate, hold and shuffle
// batches, cut links, isolate members and recover.
//
// A test drives it like this:
//
//	net := nodetest.New(seed, start)
//	a := net.Add(coreA) // cores built with node.NewCore
//	b := net.Add(coreB)
//	net.Delay = 5 * time.Millisecond
//	net.Run(time.Second, func(now time.Time) { net.Core(a).Allow(now, …) })
//	net.Cut(a, b)
//	net.Heal(a, b) // or every cut link: net.Recover()
//
// Batches travel as their CBOR encoding, decoded per receiver, so the test
// network exercises the wire format too. It is deterministic for a seed.
// It is not safe for concurrent use.
package nodetest

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

// Network is the in-memory network. Its exported fields may be changed
// between calls.
type Network struct {
	// Delay and Jitter set each delivery's latency: Delay plus a uniform
	// draw in [0, Jitter).
	Delay, Jitter time.Duration
	// Loss is the probability that one receiver misses one batch.
	Loss float64
	// Duplicate is the probability that one receiver gets a batch twice.
	Duplicate float64
	// Step is the virtual time between two rounds of Run (default 1ms).
	Step time.Duration
	// Filter, when set, is asked about every copy of a batch about to be
	// sent (gossip and anti-entropy alike), from member from to member to;
	// returning false drops that copy. It runs before Loss and Duplicate
	// and must not change b.
	Filter func(from, to int, b *crdt.Batch) bool
	// Slow, when set, adds its answer to the latency of every copy of a
	// batch from member from to member to (gossip and anti-entropy
	// alike): a stalled sender, or a slow link one way. It must not draw
	// on Rand.
	Slow func(from, to int) time.Duration
	// ShareDecoded makes all receivers of one published batch share one
	// decoding of it instead of decoding a copy each: much faster for
	// large meshes, and safe as long as cores never modify a batch they
	// are given (Step must not).
	ShareDecoded bool
	// OnReady, when set, sees every Ready a member hands over (after a
	// Tick, an anti-entropy exchange or a Leave), after its messages have
	// been published and its Directs sent.
	OnReady func(i int, now time.Time, rd node.Ready)

	now     time.Time
	rng     *rand.Rand
	members []*entry
	queue   queue
	seq     uint64
	cut     map[[2]int]bool
	hold    bool
	held    []delivery
	// Bytes counts the encoded bytes published by each member.
	Bytes []uint64
}

type entry struct {
	core *node.Core
	down bool
	// skew is added to virtual time to give this member's local clock.
	skew time.Duration
}

type delivery struct {
	at   time.Time
	seq  uint64
	to   int
	data []byte
	b    *crdt.Batch // decoded already, when ShareDecoded
}

// queue holds the deliveries in flight, in order of delivery time and,
// for equal times, of enqueueing: one FIFO bucket per distinct time and a
// min-heap of the times, so a batch published to a hundred members costs
// one heap operation, not a hundred.
type queue struct {
	buckets map[int64]*bucket
	times   times
	n       int
	last    *bucket   // the bucket pushed to last: most pushes go there again
	front   *bucket   // the earliest bucket, being drained
	free    []*bucket // emptied buckets, for reuse
}

type bucket struct {
	at   int64
	ds   []delivery
	head int // deliveries already taken
}

func (q *queue) push(d delivery) {
	t := d.at.UnixNano()
	b := q.last
	if b == nil || b.at != t {
		b = q.buckets[t]
		if b == nil {
			if k := len(q.free); k > 0 {
				b, q.free = q.free[k-1], q.free[:k-1]
			} else {
				b = &bucket{}
			}
			b.at = t
			q.buckets[t] = b
			heap.Push(&q.times, t)
		}
		q.last = b
	}
	b.ds = append(b.ds, d)
	q.n++
}

// pop removes and returns the earliest delivery due at or before limit.
func (q *queue) pop(limit int64) (delivery, bool) {
	for len(q.times) > 0 && q.times[0] <= limit {
		b := q.front
		if b == nil || b.at != q.times[0] {
			b = q.buckets[q.times[0]]
			q.front = b
		}
		if b.head < len(b.ds) {
			d := b.ds[b.head]
			b.ds[b.head] = delivery{}
			b.head++
			q.n--
			return d, true
		}
		delete(q.buckets, b.at)
		heap.Pop(&q.times)
		if q.last == b {
			q.last = nil
		}
		q.front = nil
		b.ds, b.head = b.ds[:0], 0
		q.free = append(q.free, b)
	}
	return delivery{}, false
}

type times []int64

func (t times) Len() int           { return len(t) }
func (t times) Less(i, j int) bool { return t[i] < t[j] }
func (t times) Swap(i, j int)      { t[i], t[j] = t[j], t[i] }
func (t *times) Push(x any)        { *t = append(*t, x.(int64)) }
func (t *times) Pop() any {
	old := *t
	x := old[len(old)-1]
	*t = old[:len(old)-1]
	return x
}

// New returns an empty network whose virtual time starts at start.
func New(seed uint64, start time.Time) *Network {
	return &Network{
		Step:  time.Millisecond,
		now:   start,
		rng:   rand.New(rand.NewPCG(seed, seed^0x5eed)),
		cut:   make(map[[2]int]bool),
		queue: queue{buckets: make(map[int64]*bucket)},
	}
}

// Now returns the network's virtual time.
func (n *Network) Now() time.Time { return n.now }

// Rand returns the network's seeded source, for test workloads.
func (n *Network) Rand() *rand.Rand { return n.rng }

// Add attaches a core and returns its index. Like a libp2p connect, it runs
// an anti-entropy exchange with every reachable member.
func (n *Network) Add(c *node.Core) int {
	n.members = append(n.members, &entry{core: c})
	n.Bytes = append(n.Bytes, 0)
	i := len(n.members) - 1
	n.exchange(i)
	return i
}

// AddSkewed is Add for a member whose local clock reads virtual time plus
// skew from the start (see Skew): its anti-entropy exchange already runs
// on that clock.
func (n *Network) AddSkewed(c *node.Core, skew time.Duration) int {
	n.members = append(n.members, &entry{core: c, skew: skew})
	n.Bytes = append(n.Bytes, 0)
	i := len(n.members) - 1
	n.exchange(i)
	return i
}

// AddThrough attaches a core that knows one seed only, as a node started
// with a single bootstrap address: the anti-entropy exchange runs with the
// seed alone. Gossip reaches it from every member, as gossipsub forwards
// through the seed.
func (n *Network) AddThrough(c *node.Core, seed int) int {
	n.members = append(n.members, &entry{core: c})
	n.Bytes = append(n.Bytes, 0)
	i := len(n.members) - 1
	n.sendFull(seed, i)
	n.sendFull(i, seed)
	return i
}

// ReplaceThrough swaps member i's core for c (a restart) and runs an
// anti-entropy exchange with the seed alone, as AddThrough.
func (n *Network) ReplaceThrough(i int, c *node.Core, seed int) {
	n.members[i] = &entry{core: c, skew: n.members[i].skew}
	n.sendFull(seed, i)
	n.sendFull(i, seed)
}

// Core returns member i's core.
func (n *Network) Core(i int) *node.Core { return n.members[i].core }

// Len returns how many members were added.
func (n *Network) Len() int { return len(n.members) }

// Replace swaps member i's core for c (a restart with a new incarnation)
// and runs an anti-entropy exchange.
func (n *Network) Replace(i int, c *node.Core) {
	n.members[i] = &entry{core: c, skew: n.members[i].skew}
	n.exchange(i)
}

// Crash stops member i: it neither ticks nor receives until Replace.
func (n *Network) Crash(i int) { n.members[i].down = true }

// Down reports whether member i is stopped (crashed or left).
func (n *Network) Down(i int) bool { return n.members[i].down }

// Leave makes member i leave gracefully: it publishes the messages of
// the core's Leave to every reachable member and then stops, like Crash.
func (n *Network) Leave(i int) {
	n.members[i].core.Leave(n.Local(i))
	n.handle(i)
	n.members[i].down = true
}

// Skew sets member i's local clock to virtual time plus d.
func (n *Network) Skew(i int, d time.Duration) { n.members[i].skew = d }

// Local returns member i's local clock reading at the current virtual time.
func (n *Network) Local(i int) time.Time { return n.now.Add(n.members[i].skew) }

func key(a, b int) [2]int {
	if a > b {
		a, b = b, a
	}
	return [2]int{a, b}
}

// Cut breaks the link between a and b in both directions.
func (n *Network) Cut(a, b int) { n.cut[key(a, b)] = true }

// Isolate cuts every link of a.
func (n *Network) Isolate(a int) {
	for b := range n.members {
		if b != a {
			n.Cut(a, b)
		}
	}
}

// Partition cuts every link between the groups.
func (n *Network) Partition(groups ...[]int) {
	for gi, g := range groups {
		for _, h := range groups[gi+1:] {
			for _, a := range g {
				for _, b := range h {
					n.Cut(a, b)
				}
			}
		}
	}
}

// Heal heals the link between a and b alone and runs anti-entropy between
// them, as a connection that comes back while others are still down: the
// streams of a healed partition restart one after another.
func (n *Network) Heal(a, b int) {
	if !n.cut[key(a, b)] {
		return
	}
	delete(n.cut, key(a, b))
	n.sendFull(a, b)
	n.sendFull(b, a)
}

// Recover heals every cut link and runs anti-entropy between the members
// that were cut apart.
func (n *Network) Recover() {
	healed := n.cut
	n.cut = make(map[[2]int]bool)
	for k := range sortedPairs(healed) {
		n.sendFull(k[0], k[1])
		n.sendFull(k[1], k[0])
	}
}

func sortedPairs(m map[[2]int]bool) func(func([2]int) bool) {
	return func(yield func([2]int) bool) {
		pairs := make([][2]int, 0, len(m))
		for k := range m {
			pairs = append(pairs, k)
		}
		for i := 1; i < len(pairs); i++ {
			for j := i; j > 0 && (pairs[j][0] < pairs[j-1][0] || (pairs[j][0] == pairs[j-1][0] && pairs[j][1] < pairs[j-1][1])); j-- {
				pairs[j], pairs[j-1] = pairs[j-1], pairs[j]
			}
		}
		for _, p := range pairs {
			if !yield(p) {
				return
			}
		}
	}
}

// Reachable reports whether a batch from a can reach b now.
func (n *Network) Reachable(a, b int) bool {
	return a != b && !n.cut[key(a, b)] && !n.members[a].down && !n.members[b].down
}

// Hold queues every published batch instead of delivering it, until
// Release.
func (n *Network) Hold() { n.hold = true }

// Release delivers every held batch at once, in an order shuffled by the
// network's seed, each possibly twice when Duplicate is set.
func (n *Network) Release() error {
	n.hold = false
	held := n.held
	n.held = nil
	n.rng.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
	for _, d := range held {
		if err := n.deliver(d); err != nil {
			return err
		}
	}
	return nil
}

func (n *Network) exchange(i int) {
	for j := range n.members {
		if j != i && n.Reachable(i, j) {
			n.sendFull(j, i)
			n.sendFull(i, j)
		}
	}
}

// sendFull sends member from's answer to a new connection (its
// Core.AntiEntropy) to member to.
func (n *Network) sendFull(from, to int) {
	if !n.Reachable(from, to) {
		return
	}
	n.members[from].core.AntiEntropy(n.Local(from), n.members[to].core.Self().Peer)
	n.handle(from)
}

// send delivers batches from member from to member to alone, after Delay.
func (n *Network) send(from, to int, bs []*crdt.Batch) {
	for _, b := range bs {
		data := n.encode(from, b)
		if n.Filter != nil && !n.Filter(from, to, b) {
			continue
		}
		n.enqueue(to, data, nil, n.Delay+n.slow(from, to))
	}
}

func (n *Network) slow(from, to int) time.Duration {
	if n.Slow == nil {
		return 0
	}
	return n.Slow(from, to)
}

func (n *Network) encode(from int, b *crdt.Batch) []byte {
	data, err := b.Encode()
	if err != nil {
		panic(fmt.Sprintf("nodetest: member %d built a batch that does not encode: %v", from, err))
	}
	n.Bytes[from] += uint64(len(data))
	return data
}

func (n *Network) enqueue(to int, data []byte, b *crdt.Batch, delay time.Duration) {
	n.seq++
	d := delivery{at: n.now.Add(delay), seq: n.seq, to: to, data: data, b: b}
	if n.hold {
		n.held = append(n.held, d)
		if n.Duplicate > 0 && n.rng.Float64() < n.Duplicate {
			n.held = append(n.held, d)
		}
		return
	}
	n.queue.push(d)
}

// Publish sends b from member from to every member reachable now.
func (n *Network) Publish(from int, b *crdt.Batch) {
	data := n.encode(from, b)
	var shared *crdt.Batch
	if n.ShareDecoded {
		var err error
		if shared, err = crdt.DecodeBatch(data); err != nil {
			panic(fmt.Sprintf("nodetest: member %d built a batch that does not decode: %v", from, err))
		}
	}
	for to := range n.members {
		if !n.Reachable(from, to) {
			continue
		}
		if n.Filter != nil && !n.Filter(from, to, b) {
			continue
		}
		if n.Loss > 0 && n.rng.Float64() < n.Loss {
			continue
		}
		n.enqueue(to, data, shared, n.latency()+n.slow(from, to))
		if !n.hold && n.Duplicate > 0 && n.rng.Float64() < n.Duplicate {
			n.enqueue(to, data, shared, n.latency()+n.slow(from, to))
		}
	}
}

func (n *Network) latency() time.Duration {
	d := n.Delay
	if n.Jitter > 0 {
		d += time.Duration(n.rng.Int64N(int64(n.Jitter)))
	}
	return d
}

func (n *Network) deliver(d delivery) error {
	m := n.members[d.to]
	if m.down {
		return nil
	}
	b := d.b
	if b == nil {
		var err error
		if b, err = crdt.DecodeBatch(d.data); err != nil {
			return fmt.Errorf("nodetest: delivery to %d: %w", d.to, err)
		}
	}
	return m.core.Step(n.Local(d.to), b)
}

// Tick ticks every running member once at the current virtual time and
// publishes what it asks to.
func (n *Network) Tick() {
	for i, m := range n.members {
		if m.down {
			continue
		}
		m.core.Tick(n.Local(i))
		n.handle(i)
	}
}

// handle takes member i's Ready and acts on all of it: the one place the
// network takes a core's output. It publishes Messages, sends each Direct
// to the reachable members it names, and shows the Ready to OnReady.
func (n *Network) handle(i int) {
	rd := n.members[i].core.Ready()
	for _, b := range rd.Messages {
		n.Publish(i, b)
	}
	for _, d := range rd.Direct {
		for _, p := range d.To {
			for j, o := range n.members {
				if o.core.Self().Peer == p && n.Reachable(i, j) {
					n.send(i, j, d.Batches)
				}
			}
		}
	}
	if n.OnReady != nil {
		n.OnReady(i, n.Local(i), rd)
	}
}

// Advance moves virtual time forward by d, delivering and ticking
// nothing (see Run and Drain).
func (n *Network) Advance(d time.Duration) { n.now = n.now.Add(d) }

// Run advances virtual time by d in rounds of Step: each round delivers
// the batches due, calls each (if not nil) with the round's virtual time,
// and ticks every member. It returns the first error a core's Step
// returned.
func (n *Network) Run(d time.Duration, each func(now time.Time)) error {
	end := n.now.Add(d)
	for n.now.Before(end) {
		n.now = n.now.Add(n.Step)
		for {
			d, ok := n.queue.pop(n.now.UnixNano())
			if !ok {
				break
			}
			if err := n.deliver(d); err != nil {
				return err
			}
		}
		if each != nil {
			each(n.now)
		}
		n.Tick()
	}
	return nil
}

// Drain delivers everything in flight, advancing time as needed (but
// ticking nobody), and returns the first error.
func (n *Network) Drain() error {
	for {
		d, ok := n.queue.pop(math.MaxInt64)
		if !ok {
			return nil
		}
		if d.at.After(n.now) {
			n.now = d.at
		}
		if err := n.deliver(d); err != nil {
			return err
		}
	}
}
