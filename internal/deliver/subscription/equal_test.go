package subscription_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jsbridge/jsbridge/internal/deliver/subscription"
)

// Equal sees a change in every field of Subscription but the deprecated,
// ignored AckWait (TestAckWaitIsIgnored), found by
// reflection so that a field added later without a comparison fails
// here (RateLimit once went unseen, and a Fleet took a new rate limit
// for a change of secrets only).
func TestEqualSeesEveryField(t *testing.T) {
	t.Parallel()
	a := sub("orders", "https://hooks.example/in")
	a.Headers = map[string]string{"Authorization": "Bearer x"}
	a.BackOff = []time.Duration{time.Second}
	require.True(t, subscription.Equal(a, a))
	same := a
	same.FilterSubjects = append([]string(nil), a.FilterSubjects...)
	same.Headers = map[string]string{"Authorization": "Bearer x"}
	require.True(t, subscription.Equal(a, same), "equal values in other slices and maps")

	typ := reflect.TypeOf(a)
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Name == "AckWait" {
			continue
		}
		b := a
		b.FilterSubjects = append([]string(nil), a.FilterSubjects...)
		b.Secrets = append([]string(nil), a.Secrets...)
		b.Headers = map[string]string{"Authorization": "Bearer x"}
		v := reflect.ValueOf(&b).Elem().Field(i)
		switch {
		case f.Type == reflect.TypeOf(subscription.Start{}):
			v.Set(reflect.ValueOf(subscription.StartAtSequence(9)))
		case f.Type == reflect.TypeOf(subscription.TLSFiles{}):
			v.Set(reflect.ValueOf(subscription.TLSFiles{CAFile: "ca.pem"}))
		case f.Type.Kind() == reflect.String:
			v.SetString(v.String() + "x")
		case f.Type.Kind() == reflect.Bool:
			v.SetBool(!v.Bool())
		case f.Type.Kind() == reflect.Int, f.Type.Kind() == reflect.Int64:
			v.SetInt(v.Int() + 1)
		case f.Type.Kind() == reflect.Float64:
			v.SetFloat(v.Float() + 1)
		case f.Type.Kind() == reflect.Slice:
			v.Set(reflect.Append(v, reflect.New(f.Type.Elem()).Elem()))
		case f.Type.Kind() == reflect.Map:
			v.SetMapIndex(reflect.ValueOf("X-Other"), reflect.ValueOf("y"))
		default:
			t.Fatalf("Subscription.%s: no change known for a %s; teach this test one", f.Name, f.Type)
		}
		require.False(t, subscription.Equal(a, b), "a change of %s alone", f.Name)
		require.False(t, subscription.Equal(b, a), "a change of %s alone", f.Name)
	}

	// One start time in two zones is one start.
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	x, y := a, a
	x.Start, y.Start = subscription.StartAtTime(at), subscription.StartAtTime(at.In(time.FixedZone("", 3600)))
	require.True(t, subscription.Equal(x, y))
}
