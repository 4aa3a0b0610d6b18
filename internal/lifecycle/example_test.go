package lifecycle_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jsbridge/jsbridge/internal/lifecycle"
)

// ErrAlreadyStarted is the front door's own sentinel.
var ErrAlreadyStarted = errors.New("door: already started")

// Door is how a front door (bridge, consumer) uses a Runner: Start with a
// setup step (provisioning) and the engine's run, Run for a caller that
// did the setup itself, Stop naming the door.
type Door struct {
	life *lifecycle.Runner
}

// NewDoor makes a Door with its own already-started error.
func NewDoor() *Door { return &Door{life: lifecycle.New(ErrAlreadyStarted)} }

func (d *Door) provision(context.Context) error { return nil }

func (d *Door) engine(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Start provisions, then runs the engine in the background.
func (d *Door) Start(ctx context.Context) error { return d.life.Start(ctx, d.provision, d.engine) }

// Run runs the engine in the foreground.
func (d *Door) Run(ctx context.Context) error { return d.life.Run(ctx, nil, d.engine) }

// Stop ends Start or Run and waits for it.
func (d *Door) Stop(ctx context.Context) error {
	if err := d.life.Stop(ctx); err != nil {
		return fmt.Errorf("stop door: %w", err)
	}
	return nil
}

func Example() {
	d := NewDoor()
	fmt.Println(d.Stop(context.Background()))  // before Start: nothing to stop
	fmt.Println(d.Start(context.Background())) // provisions, then runs in the background
	fmt.Println(d.Start(context.Background()))
	fmt.Println(d.Stop(context.Background()))
	fmt.Println(d.Stop(context.Background())) // again: the first's result
	// Output:
	// <nil>
	// <nil>
	// door: already started
	// <nil>
	// <nil>
}
