package simulator

import (
	"math"
	"sort"

	"github.com/ratemesh/ratemesh/limiter"
)

// The workloads: every millisecond each draws its Poisson arrivals
// (arrivals), a key for each request (uniform or zipf) and the node it
// reaches (pickNode: by the workload's node_dist, or a live node of its
// pool when that one is down), and queues the request for work.

// workloadState is one workload of the scenario as the run goes: its
// rate, keys and node pool.
type workloadState struct {
	w       Workload
	rule    int // index into sim.rules
	keyBase int // first key of the workload in the rule's key table
	keys    []string
	cdf     []float64 // zipf: cumulative probabilities
	expNeg  float64   // exp(−rate per ms)
	perMs   float64
	req     limiter.Request
	pool    []int // nil: every present node
	upPool  []int
	upVer   int
}

func (ws *workloadState) setRate(rate float64) {
	ws.w.Rate = rate
	ws.perMs = rate / 1000
	ws.expNeg = math.Exp(-ws.perMs)
}

// pickNode returns the node a request of ws reaches, or −1 when no node
// of its pool is up.
func (s *sim) pickNode(ws *workloadState) int {
	pool := ws.pool
	var i int
	switch nd := ws.w.NodeDist; nd.Kind {
	case "single":
		if nd.Node >= 0 {
			i = nd.Node
		} else if pool != nil {
			i = pool[0]
		} else {
			i = 0
		}
	case "skew":
		size := len(s.present)
		if pool != nil {
			size = len(pool)
		}
		var pos int
		if s.rng.Float64() < nd.Fraction || size == nd.K {
			pos = s.rng.IntN(nd.K)
		} else {
			pos = nd.K + s.rng.IntN(size-nd.K)
		}
		if pool != nil {
			i = pool[pos]
		} else {
			i = s.present[pos]
		}
	default:
		if pool != nil {
			i = pool[s.rng.IntN(len(pool))]
		} else if len(s.present) > 0 {
			i = s.present[s.rng.IntN(len(s.present))]
		}
	}
	if n := s.nodes[i]; n.up {
		return i
	}
	// A load balancer sends it to a live node of the pool instead.
	if pool == nil {
		if len(s.upList) == 0 {
			return -1
		}
		return int(s.upList[s.rng.IntN(len(s.upList))])
	}
	if ws.upVer != s.upVer || ws.upPool == nil {
		ws.upPool = ws.upPool[:0]
		for _, p := range pool {
			if s.nodes[p].up {
				ws.upPool = append(ws.upPool, p)
			}
		}
		ws.upVer = s.upVer
	}
	if len(ws.upPool) == 0 {
		return -1
	}
	return ws.upPool[s.rng.IntN(len(ws.upPool))]
}

func (s *sim) arrivals(ws *workloadState) int {
	m := ws.perMs
	switch {
	case m <= 0:
		return 0
	case m < 30:
		k, p := 0, 1.0
		for {
			p *= s.rng.Float64()
			if p <= ws.expNeg {
				return k
			}
			k++
		}
	}
	x := math.Round(m + math.Sqrt(m)*s.rng.NormFloat64())
	if x < 0 {
		return 0
	}
	return int(x)
}

func (s *sim) generate() {
	nowMs := epoch.UnixMilli() + s.now
	for _, ws := range s.wls {
		n := s.arrivals(ws)
		if n == 0 {
			continue
		}
		ra := s.rules[ws.rule]
		if ra.wms <= 0 {
			s.arriveClients(ws, ra, n) // leases.go
			continue
		}
		win := nowMs / ra.wms
		cost := ws.w.Cost
		for range n {
			k := 0
			if ws.cdf != nil {
				u := s.rng.Float64()
				k = sort.SearchFloat64s(ws.cdf, u)
				if k >= len(ws.cdf) {
					k = len(ws.cdf) - 1
				}
			} else if len(ws.keys) > 1 {
				k = s.rng.IntN(len(ws.keys))
			}
			gk := ws.keyBase + k
			acc := &ra.keys[gk]
			if acc.win != win {
				ra.flush(gk)
				acc.win = win
			}
			if ws.w.WellBehaved && ra.limits[gk] > 0 && acc.offCred+cost > ra.limits[gk] {
				continue // a well-behaved client keeps within its limit
			}
			acc.offReq++
			acc.offCred += cost
			if ra.refs != nil {
				acc.refCred += ra.refs[gk].Take(nowMs, cost)
			}
			s.requests++
			i := s.pickNode(ws)
			if i < 0 {
				if ws.w.WellBehaved {
					ra.falseRej++
				}
				continue
			}
			ra.sideOffered(gk, i, cost) // sides.go
			// Decided in work. The outcome only adds to acc, which
			// nothing reads before then: a key's window changes at most
			// at its first request of a millisecond.
			s.calls = append(s.calls, allowCall{ws: ws, ra: ra, k: k, gk: gk, node: i})
		}
	}
}
