//go:build !race

package shared_test

// raceEnabled: built with -race (race_test.go).
const raceEnabled = false
