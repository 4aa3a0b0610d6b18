package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jsbridge/jsbridge/event"
	"github.com/jsbridge/jsbridge/store"
)

// orderEvents is the life of one order: the events of an order-<n> stream.
var orderEvents = []string{"OrderPlaced", "OrderConfirmed", "OrderShipped"}

func orderData(order, step int) []byte {
	return fmt.Appendf(nil, `{"order":%d,"step":%d,"total_cents":%d,"currency":"EUR","items":[{"sku":"SKU-%05d","qty":%d}]}`,
		order, step, 1000+order%9000, order%100000, 1+order%5)
}

func appendStep(ctx context.Context, st *store.Store, order, step int) error {
	stream := fmt.Sprintf("order-%d", order)
	_, err := st.Append(ctx, stream, int64(step)-1, store.NewEvent{
		Name: orderEvents[step], Data: orderData(order, step),
		Meta: event.Meta{Correlation: stream},
	})
	return err
}

// produce appends n events as order-<k> streams of three events each, from
// several goroutines; it returns when all are appended.
func produce(ctx context.Context, st *store.Store, n int) error {
	orders := (n + len(orderEvents) - 1) / len(orderEvents)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				o := int(next.Add(1))
				if o > orders {
					return
				}
				for step := range orderEvents {
					if (o-1)*len(orderEvents)+step >= n {
						break
					}
					if err := appendStep(ctx, st, o, step); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// produceSteady appends rate events a second until ctx ends: each tick moves
// one open order a step further, or opens a new one.
func produceSteady(ctx context.Context, st *store.Store, rate float64, appended *atomic.Int64) error {
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	var open []int // orders not yet shipped; value = next step
	steps := map[int]int{}
	nextOrder := 1
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		var o int
		if len(open) < 10 || i%3 == 0 {
			o = nextOrder
			nextOrder++
			open = append(open, o)
		} else {
			o = open[i%len(open)]
		}
		step := steps[o]
		if err := appendStep(ctx, st, o, step); err != nil {
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		appended.Add(1)
		if step+1 == len(orderEvents) {
			delete(steps, o)
			for j, x := range open {
				if x == o {
					open = append(open[:j], open[j+1:]...)
					break
				}
			}
		} else {
			steps[o] = step + 1
		}
	}
}
