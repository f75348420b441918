//go:build race

package simulator

// raceEnabled reports whether the tests run under the race detector, where
// the heavy single-threaded scenarios are skipped (TestLibraryScenarios
// runs them without it).
const raceEnabled = true
