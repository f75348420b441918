package node

import (
	"reflect"
	"testing"
	"time"
)

// tick ticks c at now and returns the Ready it hands over.
func tick(c *Core, now time.Time) Ready {
	c.Tick(now)
	return c.Ready()
}

// TestHasReadyCountsEveryField sets each field of the pending Ready alone
// and checks that HasReady sees it, so that a new output cannot be left
// out of HasReady.
func TestHasReadyCountsEveryField(t *testing.T) {
	c := &Core{}
	rt := reflect.TypeOf(Ready{})
	for i := range rt.NumField() {
		f := rt.Field(i)
		c.ready = Ready{}
		v := reflect.ValueOf(&c.ready).Elem().Field(i)
		switch v.Kind() {
		case reflect.Slice:
			v.Set(reflect.MakeSlice(f.Type, 1, 1))
		case reflect.Pointer:
			v.Set(reflect.New(f.Type.Elem()))
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Uint64:
			v.SetUint(1)
		case reflect.Struct:
			if f.Type != reflect.TypeOf(time.Time{}) {
				t.Fatalf("Ready.%s: a struct field of type %v this test cannot set", f.Name, f.Type)
			}
			v.Set(reflect.ValueOf(time.Unix(1, 0)))
		default:
			t.Fatalf("Ready.%s: a field of kind %v this test cannot set", f.Name, v.Kind())
		}
		if !c.HasReady() {
			t.Errorf("HasReady() = false with only Ready.%s set", f.Name)
		}
	}
	c.ready = Ready{}
	if c.HasReady() {
		t.Error("HasReady() = true with nothing set")
	}
}
