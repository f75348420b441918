package mesh

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// TestSuggestionBudget: at most maxSuggestedDials suggested dials run at
// once; a peer whose dial failed waits suggestRetry before it is tried
// again, one that succeeded may be tried at once; the failures remembered
// stay under maxSuggestFailed.
func TestSuggestionBudget(t *testing.T) {
	var s suggestions
	now := time.Unix(1_700_000_000, 0)
	id := func(i int) peer.ID { return peer.ID(string(rune('a'+i%26)) + time.Duration(i).String()) }
	for i := range maxSuggestedDials {
		if ok, over := s.take(id(i), now); !ok || over {
			t.Fatalf("dial %d refused (over %v)", i, over)
		}
	}
	if ok, over := s.take(id(maxSuggestedDials), now); ok || !over {
		t.Fatalf("dial %d of a full budget: ok %v over %v", maxSuggestedDials, ok, over)
	}
	s.done(id(0), now, true)
	s.done(id(1), now, false)
	if ok, over := s.take(id(0), now.Add(suggestRetry/2)); ok || over {
		t.Errorf("a failed peer retried within suggestRetry: ok %v over %v", ok, over)
	}
	if ok, _ := s.take(id(1), now); !ok {
		t.Error("a peer whose dial succeeded was not tried again")
	}
	if ok, _ := s.take(id(0), now.Add(suggestRetry)); !ok {
		t.Error("a failed peer was not tried again after suggestRetry")
	}
	if ok, over := s.take(id(99), now); ok || !over { // 2…15, 1 and 0 in flight
		t.Errorf("a 17th dial: ok %v over %v", ok, over)
	}
	for i := range maxSuggestedDials {
		s.done(id(i), now, true)
	}
	for i := range 2 * maxSuggestFailed {
		s.inFlight++
		s.done(id(1000+i), now, true)
	}
	if len(s.failed) > maxSuggestFailed {
		t.Errorf("%d failures remembered, over %d", len(s.failed), maxSuggestFailed)
	}
	if s.inFlight != 0 {
		t.Errorf("%d dials in flight after all ended", s.inFlight)
	}
}
