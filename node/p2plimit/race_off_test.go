//go:build !race

package p2plimit_test

const raceEnabled = false
