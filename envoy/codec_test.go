package envoy

import (
	"bytes"
	"math"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// codecMarshal is what the Server's codec sends for v, in one slice.
func codecMarshal(t testing.TB, v any) []byte {
	t.Helper()
	bs, err := newCodec().Marshal(v)
	if err != nil {
		t.Fatalf("codec: marshal %T: %v", v, err)
	}
	defer bs.Free()
	return bs.Materialize()
}

// codecUnmarshal decodes b as the Server's codec does, from a buffer
// split in two (as grpc may hand it over).
func codecUnmarshal(b []byte, v any) error {
	half := len(b) / 2
	return newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(bytes.Clone(b[:half])), mem.SliceBuffer(bytes.Clone(b[half:]))}, v)
}

func limitStatus(code rlspb.RateLimitResponse_Code, name string, rpu uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, mult *wrapperspb.UInt32Value, remaining uint32, reset *durationpb.Duration) *rlspb.RateLimitResponse_DescriptorStatus {
	return &rlspb.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining, DurationUntilReset: reset,
		CurrentLimit: &rlspb.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: unit, UnitMultiplier: mult}}
}

// responses are what the Server answers, and the edge cases of every
// field appendResponse writes.
var responses = []*rlspb.RateLimitResponse{
	{},
	{OverallCode: rlspb.RateLimitResponse_OK, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{Code: rlspb.RateLimitResponse_OK}}},
	{OverallCode: rlspb.RateLimitResponse_OK, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{}}},
	{OverallCode: rlspb.RateLimitResponse_OK, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
		limitStatus(rlspb.RateLimitResponse_OK, "", 1_000_000_000, rlspb.RateLimitResponse_RateLimit_SECOND, nil, 999_999_999, durationpb.New(1e9))}},
	{OverallCode: rlspb.RateLimitResponse_OVER_LIMIT, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
		{Code: rlspb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32},
		limitStatus(rlspb.RateLimitResponse_OVER_LIMIT, "per-user", 10, rlspb.RateLimitResponse_RateLimit_MINUTE, wrapperspb.UInt32(5), 0, &durationpb.Duration{Seconds: 300}),
		limitStatus(rlspb.RateLimitResponse_OK, "ünïcode", math.MaxUint32, rlspb.RateLimitResponse_RateLimit_YEAR, wrapperspb.UInt32(0), 1, &durationpb.Duration{}),
	}},
	{OverallCode: -1, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
		limitStatus(-7, "x", 0, -2, wrapperspb.UInt32(math.MaxUint32), 0, &durationpb.Duration{Seconds: math.MinInt64, Nanos: -999_999_999}),
		limitStatus(math.MaxInt32, "", 0, math.MaxInt32, nil, 0, &durationpb.Duration{Seconds: math.MaxInt64, Nanos: math.MaxInt32}),
	}},
}

// TestCodecResponse: the codec sends the bytes proto.Marshal makes of
// every response, by hand for those the Server makes, by protobuf for the
// others.
func TestCodecResponse(t *testing.T) {
	check := func(m *rlspb.RateLimitResponse, fast bool) {
		t.Helper()
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got := codecMarshal(t, m); !bytes.Equal(got, want) {
			t.Errorf("%v:\n got %x\nwant %x", m, got, want)
		}
		n, ok := responseSize(m)
		if ok != fast {
			t.Errorf("%v: coded by hand %v, want %v", m, ok, fast)
		}
		if ok && n != len(want) {
			t.Errorf("%v: responseSize %d, want %d", m, n, len(want))
		}
	}
	for _, m := range responses {
		check(m, true)
	}
	// Fields the Server does not set go to protobuf's code.
	withUnknown := proto.Clone(responses[4]).(*rlspb.RateLimitResponse)
	withUnknown.Statuses[1].CurrentLimit.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
	for _, m := range []*rlspb.RateLimitResponse{
		{OverallCode: rlspb.RateLimitResponse_OK, ResponseHeadersToAdd: []*corepb.HeaderValue{{Key: "x-rl", Value: "1"}}},
		{RequestHeadersToAdd: []*corepb.HeaderValue{{Key: "x-rl", Value: "1"}}},
		{RawBody: []byte("over")},
		{Quota: &rlspb.RateLimitResponse_Quota{Requests: 3}},
		{Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{Quota: &rlspb.RateLimitResponse_Quota{Requests: 3}}}},
		withUnknown,
	} {
		check(m, false)
	}
	// A nil response, as protobuf encodes it: nothing.
	if got := codecMarshal(t, (*rlspb.RateLimitResponse)(nil)); len(got) != 0 {
		t.Errorf("a nil response: got %x, want nothing", got)
	}
	// Other messages too.
	h := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}
	want, _ := proto.Marshal(h)
	if got := codecMarshal(t, h); !bytes.Equal(got, want) {
		t.Errorf("health: got %x, want %x", got, want)
	}
	// Invalid UTF-8 fails as it does in protobuf.
	bad := &rlspb.RateLimitResponse{Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{limitStatus(0, "\xff", 1, 1, nil, 0, nil)}}
	if _, err := newCodec().Marshal(bad); err == nil {
		t.Error("a limit name of invalid UTF-8 was encoded")
	}
}

func descriptor(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// requests are what Envoy sends, and the cases decodeRequest leaves to
// protobuf.
var requests = []*rlspb.RateLimitRequest{
	{},
	{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{descriptor("key", "k42")}},
	{Domain: "edge", HitsAddend: math.MaxUint32, Descriptors: []*rlcommon.RateLimitDescriptor{
		descriptor("remote_address", "10.0.0.1", "path", "/api/ünï"),
		descriptor(),
		descriptor("", ""),
		{Entries: descriptor("k", "v").Entries, HitsAddend: wrapperspb.UInt64(math.MaxUint64), IsNegativeHits: true},
		{HitsAddend: wrapperspb.UInt64(0)},
	}},
	{Domain: "override", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: descriptor("k", "v").Entries,
		Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typepb.RateLimitUnit_MINUTE}}}},
}

// TestCodecRequest: the codec decodes every request as proto.Unmarshal
// does, by hand what Envoy sends.
func TestCodecRequest(t *testing.T) {
	for i, want := range requests {
		b, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got := new(rlspb.RateLimitRequest)
		if err := codecUnmarshal(b, got); err != nil {
			t.Fatalf("%v: %v", want, err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("decoded %v, want %v", got, want)
		}
		if fast := decodeRequest(b, new(rlspb.RateLimitRequest)); fast != (i < 3) {
			t.Errorf("%v: decoded by hand %v, want %v", want, fast, i < 3)
		}
	}
	// Unknown fields, merged wrappers, repeated scalars: protobuf's way.
	b, _ := proto.Marshal(requests[2])
	for _, extra := range [][]byte{
		protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1),
		protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "later domain"),
		protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType),
			protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 3))),
	} {
		in := append(bytes.Clone(b), extra...)
		want, got := new(rlspb.RateLimitRequest), new(rlspb.RateLimitRequest)
		if err := proto.Unmarshal(in, want); err != nil {
			t.Fatal(err)
		}
		if err := codecUnmarshal(in, got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("%x: decoded %v, want %v", in, got, want)
		}
	}
	// Malformed: an error, as from protobuf.
	for _, in := range [][]byte{
		{0x0a, 0x05, 'a'},
		protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\xff"),
		{0x00},
	} {
		if err := codecUnmarshal(in, new(rlspb.RateLimitRequest)); err == nil {
			t.Errorf("%x: decoded without an error", in)
		}
	}
}

// FuzzCodecRequest: whatever the bytes, the codec decodes the message
// proto.Unmarshal does, or fails where it fails.
func FuzzCodecRequest(f *testing.F) {
	for _, r := range requests {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want, got := new(rlspb.RateLimitRequest), new(rlspb.RateLimitRequest)
		werr := proto.Unmarshal(b, want)
		gerr := codecUnmarshal(b, got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%x: error %v, protobuf's %v", b, gerr, werr)
		}
		if werr == nil && !proto.Equal(got, want) {
			t.Fatalf("%x: decoded %v, protobuf %v", b, got, want)
		}
	})
}

// FuzzCodecResponse: the codec encodes the responses the Server makes as
// proto.Marshal does.
func FuzzCodecResponse(f *testing.F) {
	f.Add(int32(1), int32(2), "name", uint32(10), int32(2), uint32(7), true, uint32(3), int64(60), int32(0), uint8(2))
	f.Add(int32(0), int32(0), "", uint32(0), int32(0), uint32(0), false, uint32(0), int64(0), int32(-1), uint8(0))
	f.Fuzz(func(t *testing.T, overall, code int32, name string, rpu uint32, unit int32, mult uint32, hasMult bool, remaining uint32, sec int64, nanos int32, n uint8) {
		m := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_Code(overall)}
		for i := range int(n % 5) {
			st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_Code(code), LimitRemaining: remaining + uint32(i)}
			if i%2 == 0 {
				st.CurrentLimit = &rlspb.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: rlspb.RateLimitResponse_RateLimit_Unit(unit)}
				if hasMult {
					st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(mult)
				}
			}
			if i < 3 {
				st.DurationUntilReset = &durationpb.Duration{Seconds: sec, Nanos: nanos}
			}
			m.Statuses = append(m.Statuses, st)
		}
		want, werr := proto.Marshal(m)
		bs, gerr := newCodec().Marshal(m)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%v: error %v, protobuf's %v", m, gerr, werr)
		}
		if werr == nil && !bytes.Equal(bs.Materialize(), want) {
			t.Fatalf("%v:\n got %x\nwant %x", m, bs.Materialize(), want)
		}
	})
}

// BenchmarkCodec: a request as the harness sends it decoded, and the
// answer encoded, by the codec and by grpc's protobuf codec.
func BenchmarkCodec(b *testing.B) {
	req, _ := proto.Marshal(requests[1])
	resp := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
		limitStatus(rlspb.RateLimitResponse_OK, "", 1_000_000_000, rlspb.RateLimitResponse_RateLimit_SECOND, nil, 999_999_999, durationpb.New(1e9))}}
	for _, c := range []struct {
		name  string
		codec interface {
			Marshal(any) (mem.BufferSlice, error)
			Unmarshal(mem.BufferSlice, any) error
		}
	}{{"hand", newCodec()}, {"protobuf", newCodec().proto}} {
		b.Run("decode/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(req)}, new(rlspb.RateLimitRequest)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("encode/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bs, err := c.codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				bs.Free()
			}
		})
	}
}
