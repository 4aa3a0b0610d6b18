package deliver

import "testing"

// A partition released to another replica starts the next ownership
// cycle once it finished, not before, and never blocks when a cycle is
// due already.
func TestWakeOnFinishStartsTheNextCycleWhenThePartitionFinished(t *testing.T) {
	t.Parallel()
	done := make(chan struct{})
	cycleNow := make(chan struct{}, 1)
	woke := make(chan struct{})
	go func() { wakeOnFinish(done, cycleNow); close(woke) }()
	select {
	case <-cycleNow:
		t.Fatal("a cycle was started before the partition finished")
	case <-woke:
		t.Fatal("wakeOnFinish returned before the partition finished")
	default:
	}
	close(done)
	<-woke
	select {
	case <-cycleNow:
	default:
		t.Fatal("no cycle started once the partition finished")
	}

	cycleNow <- struct{}{} // a cycle is due already
	wakeOnFinish(done, cycleNow)
	<-cycleNow
}
