package main

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// The gRPC calls (grpcConn) send requests encoded once, before a phase,
// and read the few fields of the answers they need, for both systems
// alike: the load generator's cost per call is the same for both, and
// this module need not link Gubernator's client package (which brings
// Kubernetes' and etcd's clients: minutes of compiling, and an etcd
// rpc.proto that clashes with gossipsub's in one binary).

// Full method names.
const (
	guberGetRateLimits = "/pb.gubernator.V1/GetRateLimits"
	rlsShouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
)

// guberRequest encodes Gubernator's GetRateLimitsReq of one RateLimitReq
// per key (gubernator.proto: requests = 1; name = 1, unique_key = 2,
// hits = 3, limit = 4, duration = 5, algorithm = 6 (TOKEN_BUCKET, 0,
// omitted), behavior = 7).
func guberRequest(l limitSpec, keys ...string) []byte {
	var out []byte
	for _, k := range keys {
		var r []byte
		r = protowire.AppendTag(r, 1, protowire.BytesType)
		r = protowire.AppendString(r, l.name)
		r = protowire.AppendTag(r, 2, protowire.BytesType)
		r = protowire.AppendString(r, k)
		r = protowire.AppendTag(r, 3, protowire.VarintType)
		r = protowire.AppendVarint(r, 1)
		r = protowire.AppendTag(r, 4, protowire.VarintType)
		r = protowire.AppendVarint(r, uint64(l.limit))
		r = protowire.AppendTag(r, 5, protowire.VarintType)
		r = protowire.AppendVarint(r, uint64(l.window.Milliseconds()))
		if l.behavior != 0 {
			r = protowire.AppendTag(r, 7, protowire.VarintType)
			r = protowire.AppendVarint(r, uint64(l.behavior))
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, r)
	}
	return out
}

// guberAnswer is one RateLimitResp: status = 1 (UNDER_LIMIT 0,
// OVER_LIMIT 1), reset_time = 4, error = 5.
type guberAnswer struct {
	OverLimit bool
	ResetTime int64
	Error     string
}

// parseGuberResponse decodes a GetRateLimitsResp (responses = 1).
func parseGuberResponse(b []byte) ([]guberAnswer, error) {
	var out []guberAnswer
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v uint64, sub []byte) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		var a guberAnswer
		err := eachField(sub, func(num protowire.Number, typ protowire.Type, v uint64, s []byte) error {
			switch {
			case num == 1 && typ == protowire.VarintType:
				a.OverLimit = v == 1
			case num == 4 && typ == protowire.VarintType:
				a.ResetTime = int64(v)
			case num == 5 && typ == protowire.BytesType:
				a.Error = string(s)
			}
			return nil
		})
		out = append(out, a)
		return err
	})
	return out, err
}

// rlsAnswer is what the harness reads of Envoy's RateLimitResponse:
// overall_code = 1 (OK 1, OVER_LIMIT 2), and per statuses = 2 whether it
// carries a current_limit (= 2).
type rlsAnswer struct {
	OK       bool
	Statuses int
	Limited  int // statuses with a current_limit
}

func parseRLSResponse(b []byte) (rlsAnswer, error) {
	var a rlsAnswer
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v uint64, sub []byte) error {
		switch {
		case num == 1 && typ == protowire.VarintType:
			a.OK = v == 1
		case num == 2 && typ == protowire.BytesType:
			a.Statuses++
			return eachField(sub, func(num protowire.Number, typ protowire.Type, _ uint64, _ []byte) error {
				if num == 2 && typ == protowire.BytesType {
					a.Limited++
				}
				return nil
			})
		}
		return nil
	})
	return a, err
}

// eachField calls f for every field of message b: a varint's value, or a
// length-delimited field's bytes; other wire types are skipped.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, sub []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("protobuf: bad tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var v uint64
		var sub []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			sub, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("protobuf: field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, typ, v, sub); err != nil {
			return err
		}
	}
	return nil
}

var errNoLimit = errors.New("ShouldRateLimit: no limit applied (is the node serving the descriptor file?)")
