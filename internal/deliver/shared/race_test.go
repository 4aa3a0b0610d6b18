//go:build race

package shared_test

// raceEnabled: built with -race, where everything runs several times
// slower (time bounds measured without it are widened, and said so).
const raceEnabled = true
