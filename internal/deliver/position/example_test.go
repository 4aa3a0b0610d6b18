package position_test

import (
	"context"
	"fmt"
	"os"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
)

// An owner that took partition 3's lease (epoch 12) claims its record,
// runs the commit loop, and sends a stream's next version only once the
// settlement of the previous one is committed (write before next).
func Example() {
	dir, _ := os.MkdirTemp("", "position-example")
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{Dir: dir, Port: embedded.RandomPort})
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	nc, _ := srv.Connect()
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())

	kv, err := position.Bucket(ctx, js, position.DefaultBucket, 1)
	if err != nil {
		panic(err)
	}
	p, err := position.Claim(ctx, js, kv, position.Config{Partition: 3, Owner: "replica-a", Epoch: 12})
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	// Subscription "billing" answered 2xx for version 7 of order-42,
	// stored at sequence 1048240 of the events stream.
	p.Settled("billing", "order-42", position.Entry{Seq: 1048240, Version: 7})
	if err := p.Wait(ctx, "billing", "order-42", 1048240); err != nil {
		fmt.Println("do not send version 8:", err)
	}
	r := p.Record()
	fmt.Println(position.Key(3), r.Owner, r.Epoch, r.Covers("billing", "order-42", 1048240))

	cancel()
	fmt.Println(<-done)
	// Output:
	// pos.p3 replica-a 12 true
	// <nil>
}
