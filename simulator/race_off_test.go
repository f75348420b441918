//go:build !race

package simulator

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = false
