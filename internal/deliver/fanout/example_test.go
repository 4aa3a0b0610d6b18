package fanout_test

import (
	"context"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jsbridge/jsbridge/embedded"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout"
	"github.com/jsbridge/jsbridge/internal/deliver/fanout/member"
	"github.com/jsbridge/jsbridge/internal/deliver/position"
	"github.com/jsbridge/jsbridge/internal/deliver/reader"
	"github.com/jsbridge/jsbridge/wire"
)

// printer is a Sender that prints each delivery and answers 2xx.
type printer struct{ done chan struct{} }

func (p printer) Attempt(_ context.Context, d fanout.Delivery) fanout.Settlement {
	fmt.Printf("%s: seq %d, previous version %d\n", d.Subscription, d.Event.Seq, d.Previous)
	p.done <- struct{}{}
	return fanout.Settlement{Act: fanout.Delivered}
}

// The owner of partition 0 claims its record, runs its commits, and
// dispatches the events the reader hands it: version 1 of order-42 goes
// out only once the commit covering version 0 succeeded.
func Example() {
	dir, _ := os.MkdirTemp("", "fanout-example")
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
	defer cancel()
	kv, _ := position.Bucket(ctx, js, position.DefaultBucket, 1)
	pos, err := position.Claim(ctx, js, kv, position.Config{Partition: 0, Owner: "replica-a", Epoch: 1})
	if err != nil {
		panic(err)
	}
	go func() { _ = pos.Run(ctx) }()

	members := member.NewIndex()
	if err := members.Put(member.Member{Name: "billing", Filters: []string{"events.order.>"}, Ordered: true}); err != nil {
		panic(err)
	}
	send := printer{done: make(chan struct{})}
	f := fanout.New(fanout.Config{Partition: 0, Epoch: 1}, members, pos, send, nil, nil)
	defer f.Close()
	for v, seq := range []uint64{7, 9} {
		f.Dispatch(reader.Event{Seq: seq, Subject: "events.order.order-42.Placed",
			Header: nats.Header{wire.HeaderStreamVersion: {fmt.Sprint(v)}}})
	}
	<-send.done
	<-send.done
	// Output:
	// billing: seq 7, previous version -1
	// billing: seq 9, previous version 0
}
