//go:build race

package main

// raceEnabled: the race detector slows the test clients 5–10×, so a
// client cannot offer a flood to real processes, and timing bounds that
// hold without it are checked only without it.
const raceEnabled = true
