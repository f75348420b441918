//go:build race

package p2plimit_test

// raceEnabled: the race detector slows every goroutine 5–10×; a test that
// offers load scales it down to what a loaded machine can still carry
// (see the tests that read it).
const raceEnabled = true
