package main

import (
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func TestParseRLSResponse(t *testing.T) {
	for _, c := range []struct {
		name string
		resp *rlspb.RateLimitResponse
		want rlsAnswer
	}{
		{"ok", &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
			{Code: rlspb.RateLimitResponse_OK, CurrentLimit: &rlspb.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: rlspb.RateLimitResponse_RateLimit_SECOND}, LimitRemaining: 4}}},
			rlsAnswer{OK: true, Statuses: 1, Limited: 1}},
		{"over", &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OVER_LIMIT, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
			{Code: rlspb.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlspb.RateLimitResponse_RateLimit{RequestsPerUnit: 5}}}},
			rlsAnswer{OK: false, Statuses: 1, Limited: 1}},
		{"no limit applies", &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
			{Code: rlspb.RateLimitResponse_OK}}, RawBody: []byte("x")},
			rlsAnswer{OK: true, Statuses: 1, Limited: 0}},
	} {
		b, err := proto.Marshal(c.resp)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseRLSResponse(b)
		if err != nil || got != c.want {
			t.Errorf("%s: parseRLSResponse = %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	if _, err := parseRLSResponse([]byte{0x0a, 0x05, 0x01}); err == nil {
		t.Error("a truncated message: no error")
	}
}

func TestGuberRequestEncoding(t *testing.T) {
	l := limitSpec{name: "acc", limit: 1000, window: time.Second, behavior: guberGlobal}
	b := guberRequest(l, "k1", "k2")
	var keys []string
	err := eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, sub []byte) error {
		if num != 1 || typ != protowire.BytesType {
			t.Errorf("GetRateLimitsReq: field %d type %d, want requests = 1", num, typ)
		}
		got := map[protowire.Number]any{}
		_ = eachField(sub, func(num protowire.Number, typ protowire.Type, v uint64, s []byte) error {
			if typ == protowire.BytesType {
				got[num] = string(s)
			} else {
				got[num] = v
			}
			return nil
		})
		want := map[protowire.Number]any{1: "acc", 3: uint64(1), 4: uint64(1000), 5: uint64(1000), 7: uint64(guberGlobal)}
		for n, v := range want {
			if got[n] != v {
				t.Errorf("RateLimitReq field %d = %v, want %v", n, got[n], v)
			}
		}
		keys = append(keys, got[2].(string))
		return nil
	})
	if err != nil || len(keys) != 2 || keys[0] != "k1" || keys[1] != "k2" {
		t.Fatalf("keys %v, %v", keys, err)
	}
}

func TestParseGuberResponse(t *testing.T) {
	resp := func(status, reset uint64, errMsg string) []byte {
		var r []byte
		if status != 0 {
			r = protowire.AppendTag(r, 1, protowire.VarintType)
			r = protowire.AppendVarint(r, status)
		}
		r = protowire.AppendTag(r, 2, protowire.VarintType)
		r = protowire.AppendVarint(r, 1000)
		r = protowire.AppendTag(r, 4, protowire.VarintType)
		r = protowire.AppendVarint(r, reset)
		if errMsg != "" {
			r = protowire.AppendTag(r, 5, protowire.BytesType)
			r = protowire.AppendString(r, errMsg)
		}
		// metadata = 6, a map entry: skipped
		r = protowire.AppendTag(r, 6, protowire.BytesType)
		r = protowire.AppendBytes(r, []byte{0x0a, 0x01, 'o', 0x12, 0x01, 'x'})
		var out []byte
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		return protowire.AppendBytes(out, r)
	}
	b := append(resp(0, 1_795_000_001_000, ""), resp(1, 1_795_000_002_000, "boom")...)
	got, err := parseGuberResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	want := []guberAnswer{{OverLimit: false, ResetTime: 1_795_000_001_000}, {OverLimit: true, ResetTime: 1_795_000_002_000, Error: "boom"}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("parseGuberResponse = %+v, want %+v", got, want)
	}
}

func TestRawCodec(t *testing.T) {
	in := []byte{1, 2, 3}
	b, err := rawCodec{}.Marshal(&in)
	if err != nil || string(b) != string(in) {
		t.Fatalf("Marshal = %v, %v", b, err)
	}
	var out []byte
	if err := (rawCodec{}).Unmarshal([]byte{4, 5}, &out); err != nil || string(out) != "\x04\x05" {
		t.Fatalf("Unmarshal = %v, %v", out, err)
	}
	if _, err := (rawCodec{}).Marshal("x"); err == nil {
		t.Error("Marshal of a string: no error")
	}
}
