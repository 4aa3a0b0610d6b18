//go:build race

package main

// raceDetector is true when the tests run with -race.
const raceDetector = true
