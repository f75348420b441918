//go:build race

package mesh_test

// raceEnabled: the race detector slows every goroutine 5–10×, and with
// it delivery on a loaded machine; timing bounds that hold without it are
// relaxed (see the tests that read it).
const raceEnabled = true
