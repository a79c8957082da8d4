package resource_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/parleyhq/parley/platform/resource"
)

func TestDecode(t *testing.T) {
	data, err := proto.Marshal(wrapperspb.String("hello"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := resource.Decode(data, &wrapperspb.StringValue{})
	if err != nil || m.GetValue() != "hello" {
		t.Errorf("Decode = %v, %v; want hello", m, err)
	}
	// A corrupt record's error says what it was meant to be.
	if _, err := resource.Decode([]byte{0xff}, &wrapperspb.StringValue{}); err == nil || !strings.Contains(err.Error(), "StringValue") {
		t.Errorf("Decode of garbage = %v, want an error naming the type", err)
	}
}
