package envoy

import (
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// codec is the Server's gRPC codec: grpc's protobuf codec, except that
// ShouldRateLimit's request is decoded, and its response encoded, by the
// functions below, written for these two messages (protobuf's generic
// code was 5.5 % of the server's CPU under a flood of ShouldRateLimit;
// see BenchmarkCodec). They give the bytes and messages protobuf's code
// gives, or hand the message to it: decodeRequest takes only the fields
// Envoy sends, and appendResponse only the fields the Server sets.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2(grpcproto.Name)} }

func (codec) Name() string { return grpcproto.Name }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*rlspb.RateLimitResponse); ok && m != nil {
		if n, ok := responseSize(m); ok && mem.IsBelowBufferPoolingThreshold(n) {
			return mem.BufferSlice{mem.SliceBuffer(appendResponse(make([]byte, 0, n), m))}, nil
		}
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(*rlspb.RateLimitRequest); ok {
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		if decodeRequest(buf.ReadOnlyData(), m) {
			return nil
		}
		proto.Reset(m)
		return proto.Unmarshal(buf.ReadOnlyData(), m) // its error, as grpc's codec returns it
	}
	return c.proto.Unmarshal(data, v)
}

// decodeRequest decodes b into the empty m and reports true when b holds
// only the fields Envoy sends (domain, hits_addend, and descriptors of
// entries, hits_addend and is_negative_hits), each of its wire type, and
// nothing malformed: then m is the message proto.Unmarshal makes of b.
// Otherwise (an unknown field, a descriptor's limit override, a
// hits_addend wrapper given twice, invalid UTF-8, a bad encoding) it
// reports false, and m is to be reset and left to proto.Unmarshal.
func decodeRequest(b []byte, m *rlspb.RateLimitRequest) bool {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v uint64, s []byte) bool {
		switch {
		case num == 1 && typ == protowire.BytesType && utf8.Valid(s):
			m.Domain = string(s)
		case num == 2 && typ == protowire.BytesType:
			d := new(rlcommon.RateLimitDescriptor)
			if !decodeDescriptor(s, d) {
				return false
			}
			m.Descriptors = append(m.Descriptors, d)
		case num == 3 && typ == protowire.VarintType:
			m.HitsAddend = uint32(v)
		default:
			return false
		}
		return true
	})
}

func decodeDescriptor(b []byte, d *rlcommon.RateLimitDescriptor) bool {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v uint64, s []byte) bool {
		switch {
		case num == 1 && typ == protowire.BytesType:
			e := new(rlcommon.RateLimitDescriptor_Entry)
			if !decodeEntry(s, e) {
				return false
			}
			d.Entries = append(d.Entries, e)
		case num == 3 && typ == protowire.BytesType && d.HitsAddend == nil:
			// Given twice, the two would be merged: left to protobuf.
			w := new(wrapperspb.UInt64Value)
			if !eachField(s, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) bool {
				w.Value = v
				return num == 1 && typ == protowire.VarintType
			}) {
				return false
			}
			d.HitsAddend = w
		case num == 4 && typ == protowire.VarintType:
			d.IsNegativeHits = protowire.DecodeBool(v)
		default:
			return false
		}
		return true
	})
}

func decodeEntry(b []byte, e *rlcommon.RateLimitDescriptor_Entry) bool {
	return eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, s []byte) bool {
		switch {
		case typ != protowire.BytesType || !utf8.Valid(s):
			return false
		case num == 1:
			e.Key = string(s)
		case num == 2:
			e.Value = string(s)
		default:
			return false
		}
		return true
	})
}

// eachField hands f every field of the message b in order: its number,
// its wire type and its value (v for a varint, s for bytes), and reports
// whether b is well formed, holds only varint and bytes fields, and f
// took each (true).
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, s []byte) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v uint64
		var s []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			s, n = protowire.ConsumeBytes(b)
		default:
			return false
		}
		if n < 0 || !f(num, typ, v, s) {
			return false
		}
		b = b[n:]
	}
	return true
}

// responseSize is the encoded size of m, and whether appendResponse can
// encode it: only the fields the Server sets (overall_code, and statuses
// with code, current_limit, limit_remaining and duration_until_reset),
// each status set, valid UTF-8 in names, and no unknown fields.
func responseSize(m *rlspb.RateLimitResponse) (int, bool) {
	if len(m.ResponseHeadersToAdd) > 0 || len(m.RequestHeadersToAdd) > 0 || len(m.RawBody) > 0 ||
		m.DynamicMetadata != nil || m.Quota != nil || len(m.ProtoReflect().GetUnknown()) > 0 {
		return 0, false
	}
	n := sizeVarintField(uint64(m.OverallCode))
	for _, st := range m.Statuses {
		k, ok := statusSize(st)
		if !ok {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(k)
	}
	return n, true
}

func statusSize(st *rlspb.RateLimitResponse_DescriptorStatus) (int, bool) {
	if st == nil || st.Quota != nil || len(st.ProtoReflect().GetUnknown()) > 0 {
		return 0, false
	}
	n := sizeVarintField(uint64(st.Code)) + sizeVarintField(uint64(st.LimitRemaining))
	if l := st.CurrentLimit; l != nil {
		k, ok := limitSize(l)
		if !ok {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(k)
	}
	if d := st.DurationUntilReset; d != nil {
		if len(d.ProtoReflect().GetUnknown()) > 0 {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(durationSize(d.Seconds, d.Nanos))
	}
	return n, true
}

func limitSize(l *rlspb.RateLimitResponse_RateLimit) (int, bool) {
	if len(l.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(l.Name) {
		return 0, false
	}
	n := sizeVarintField(uint64(l.RequestsPerUnit)) + sizeVarintField(uint64(l.Unit))
	if l.Name != "" {
		n += 1 + protowire.SizeBytes(len(l.Name))
	}
	if w := l.UnitMultiplier; w != nil {
		if len(w.ProtoReflect().GetUnknown()) > 0 {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(sizeVarintField(uint64(w.Value)))
	}
	return n, true
}

// sizeVarintField is the size of a varint field numbered below 16, or 0
// for the value 0 (not sent).
func sizeVarintField(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func durationSize(sec int64, nanos int32) int {
	return sizeVarintField(uint64(sec)) + sizeVarintField(uint64(nanos))
}

// appendVarintField appends field num (below 16) of value v unless v is 0.
func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// appendResponse appends m, which responseSize accepted, as
// proto.Marshal encodes it: fields in the order of their numbers.
func appendResponse(b []byte, m *rlspb.RateLimitResponse) []byte {
	b = appendVarintField(b, 1, uint64(m.OverallCode))
	for _, st := range m.Statuses {
		n, _ := statusSize(st)
		b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(n))
		b = appendVarintField(b, 1, uint64(st.Code))
		if l := st.CurrentLimit; l != nil {
			n, _ := limitSize(l)
			b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(n))
			b = appendVarintField(b, 1, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, 2, uint64(l.Unit))
			if l.Name != "" {
				b = protowire.AppendString(protowire.AppendTag(b, 3, protowire.BytesType), l.Name)
			}
			if w := l.UnitMultiplier; w != nil {
				b = protowire.AppendVarint(protowire.AppendTag(b, 4, protowire.BytesType), uint64(sizeVarintField(uint64(w.Value))))
				b = appendVarintField(b, 1, uint64(w.Value))
			}
		}
		b = appendVarintField(b, 3, uint64(st.LimitRemaining))
		if d := st.DurationUntilReset; d != nil {
			b = protowire.AppendVarint(protowire.AppendTag(b, 4, protowire.BytesType), uint64(durationSize(d.Seconds, d.Nanos)))
			b = appendVarintField(b, 1, uint64(d.Seconds))
			b = appendVarintField(b, 2, uint64(d.Nanos))
		}
	}
	return b
}
