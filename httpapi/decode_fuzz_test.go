package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// decode runs data through readBody as a request body.
func decode(data []byte) (*body, error) {
	r := httptest.NewRequest("POST", "/v1/allow", bytes.NewReader(data))
	return readBody(httptest.NewRecorder(), r)
}

// wholeBuf is a body read whole before the API sees it, as cmd/ratemesh's
// server hands it over (a wholeBody).
type wholeBuf struct{ bytes.Buffer }

func (*wholeBuf) Close() error { return nil }

// decodeWhole runs data through readBody as a body read whole, which it
// decodes in place.
func decodeWhole(data []byte) (*body, error) {
	wb := new(wholeBuf)
	wb.Write(data)
	r := httptest.NewRequest("POST", "/v1/allow", wb)
	return readBody(httptest.NewRecorder(), r)
}

// sameDecoding fails unless a body decoded from a reader (b, err) and the
// same one decoded in place (bw, errw) agree: the same error, or the same
// fields and checks.
func sameDecoding(t *testing.T, data []byte, b *body, err error, bw *body, errw error) {
	t.Helper()
	switch {
	case (err == nil) != (errw == nil):
		t.Fatalf("%q: from a reader %v, in place %v", data, err, errw)
	case err != nil:
		if err.Error() != errw.Error() {
			t.Fatalf("%q: from a reader %v, in place %v", data, err, errw)
		}
	case !reflect.DeepEqual(b.top, bw.top) || b.kind != bw.kind || b.nCheck != bw.nCheck || len(b.checks) != len(bw.checks) || len(b.checks) > 0 && !reflect.DeepEqual(b.checks, bw.checks):
		t.Fatalf("%q: from a reader %+v, in place %+v", data, b.top, bw.top)
	}
}

// fromFields reads one check of the single form back out of o, as the
// AllowRequest that says it, and the check readCheck makes of it; ok is
// false when the fields are refused.
func fromFields(o *object) (req AllowRequest, c check, ok bool) {
	f := newFields(o, -1)
	c = readCheck(f)
	req.Rule, req.Key = c.rule, c.key
	if n, has := f.uint(fCost, ^uint64(0)); has {
		req.Cost = &n
	}
	req.Type = f.str(fType, false)
	if n, has := f.uint(fUnits, ^uint64(0)); has {
		req.Units = &n
	}
	req.Class = f.str(fClass, false)
	if n, has := f.uint(fMaxWait, 30_000); has {
		req.MaxWaitMs = &n
	}
	return req, c, f.done(singleFields) == nil
}

// agrees checks what scan noted in o against encoding/json's reading of
// the same object, m: every known field there with its kind and text,
// and the least other name.
func agrees(t *testing.T, o *object, m map[string]any) {
	t.Helper()
	var others []string
	for k, v := range m {
		fd := lookup([]byte(`"` + k + `"`))
		if !strings.ContainsAny(k, "\"\\") && fd < numFields {
			got := o.fields[fd]
			if !got.given || got.kind != kindOf(v) {
				t.Fatalf("%s: scanned %+v, encoding/json %#v", k, got, v)
			}
			switch v := v.(type) {
			case string:
				if unquote(got.raw) != v {
					t.Fatalf("%s: scanned %q, encoding/json %q", k, unquote(got.raw), v)
				}
			case json.Number:
				if string(got.raw) != string(v) {
					t.Fatalf("%s: scanned %s, encoding/json %s", k, got.raw, v)
				}
			}
			continue
		}
		others = append(others, k)
	}
	sort.Strings(others)
	if len(others) > 0 && (!o.hasUnknown || o.unknown != others[0]) || len(others) == 0 && o.hasUnknown {
		t.Fatalf("unknown fields %q, scanned least %q (%v)", others, o.unknown, o.hasUnknown)
	}
}

func kindOf(v any) kind {
	switch v.(type) {
	case bool:
		return kindBool
	case json.Number:
		return kindNumber
	case string:
		return kindString
	case []any:
		return kindArray
	case map[string]any:
		return kindObject
	}
	return kindNull
}

// FuzzDecodeAllow: decoding never panics; a body it accepts is one
// encoding/json accepts, with the same fields; and a check it accepts,
// encoded again as an AllowRequest, decodes to the same check.
func FuzzDecodeAllow(f *testing.F) {
	for _, s := range []string{
		`{"rule":"api","key":"k"}`, `{"rule":"api","key":"k","cost":3,"class":"payer","max_wait_ms":20}`,
		`{"rule":"api","key":"k","type":"query","units":2}`, `{"checks":[{"rule":"a","key":"b"},5,{"rule":"c","key":"d","cost":1e2}]}`,
		`{"\u0072ule":"a\"b","key":"caf\u00e9","zz":[{"a":"]"}],"cost":-0}`, `{"rule":"a","key":"b"} x`, `[1]`, ``, `{"cost":2.0,"checks":null}`,
		`{"rule":"a","key":"` + strings.Repeat("k", MaxBodyBytes) + `"}`, ` {"rule":"a","key":"k"}` + "\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := decode(data)
		bw, errw := decodeWhole(data)
		sameDecoding(t, data, b, err, bw, errw)
		if bw != nil {
			bw.release()
		}
		if err != nil {
			if _, ok := err.(*badRequest); !ok {
				t.Fatalf("error %T %v, want a bad request", err, err)
			}
			return
		}
		defer b.release()
		var m map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("decoded a body encoding/json refuses: %v", err)
		}
		agrees(t, &b.top, m)
		if list, ok := m["checks"].([]any); ok {
			if b.nCheck != len(list) || len(b.checks) != min(len(list), MaxChecks) {
				t.Fatalf("%d checks scanned (%d kept), encoding/json %d", b.nCheck, len(b.checks), len(list))
			}
			for i, e := range b.checks {
				if e.kind != kindOf(list[i]) {
					t.Fatalf("checks[%d]: scanned %v, encoding/json %#v", i, e.kind, list[i])
				}
				if e.kind == kindObject {
					agrees(t, &b.checks[i].obj, list[i].(map[string]any))
				}
			}
		}
		if b.top.fields[fChecks].given {
			return
		}
		req, c, ok := fromFields(&b.top)
		if !ok {
			return
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := decode(again)
		if err != nil {
			t.Fatalf("%s, from %s: %v", again, data, err)
		}
		defer b2.release()
		req2, c2, ok := fromFields(&b2.top)
		if !ok || c2 != c || !equalRequests(req, req2) {
			t.Fatalf("%s decodes to %+v, %s to %+v", data, c, again, c2)
		}
	})
}

func equalRequests(a, b AllowRequest) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// failing is a body whose reading fails after its bytes.
type failing struct{ r *bytes.Reader }

func (f failing) Read(p []byte) (int, error) {
	if f.r.Len() == 0 {
		return 0, errors.New("connection reset")
	}
	return f.r.Read(p)
}

// TestReadBodyError: a body cut short by a read error is answered as
// encoding/json's Decoder met it: the error inside a value, data after
// one that is whole.
func TestReadBodyError(t *testing.T) {
	for body, want := range map[string]string{
		`{"rule":"a"`:             "body: malformed JSON: connection reset",
		``:                        "body: malformed JSON: connection reset",
		`{"rule":"a","key":"k"}`:  "body: data after the JSON object",
		`{"rule":"a","key":"k"} `: "body: data after the JSON object",
		`{"rule":"a",,`:           "body: malformed JSON: invalid character ',' looking for beginning of object key string",
	} {
		r := httptest.NewRequest("POST", "/v1/allow", failing{bytes.NewReader([]byte(body))})
		_, err := readBody(httptest.NewRecorder(), r)
		if err == nil || err.Error() != want {
			t.Errorf("%q: %v, want %s", body, err, want)
		}
	}
}

// FuzzValid: valid says what json.Valid says of any bytes.
func FuzzValid(f *testing.F) {
	for _, s := range []string{
		``, ` `, `{}`, `[]`, ` { } `, `[ ]`, `{"a":1}`, `{"a" : [1, 2.5, -0, 1e3, 1E+3, 2e-7, true, false, null, "x"]}`,
		`{"a":1,}`, `{"a":1 "b":2}`, `{,}`, `[,]`, `[1,]`, `{"a"}`, `{"a":}`, `{1:2}`, `{"a":1}}`, `[1]]`, `[1}`, `{"a":1]`,
		`01`, `-`, `-0`, `-01`, `1.`, `.5`, `1e`, `1e+`, `+1`, `0x10`, `1.5e3.2`, `tru`, `truee`, `nul`, `False`, `"`, `"\"`,
		`"\u00e9\n\t\/\b\f\r\\\""`, `"\u00g0"`, `"\u00e"`, `"\x"`, "\"\x01\"", "\"\x7f\xff\xfe\"", "\"a\tb\"", `{"a":"b"} x`, `{"a":"b"}{}`,
		"\t\n\r {\"k\"\n:\r1}\n", `[[[[[[[[[[]]]]]]]]]]`, `[{"a":[{"b":{}}]}]`, `"\ud800"`, `1 2`, `{"a":1`, `[`, `{`, `]`, `}`,
		strings.Repeat("[", 64) + strings.Repeat("]", 64), strings.Repeat("[", 65) + "1" + strings.Repeat("]", 65),
		strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		strings.Repeat("[", 100) + strings.Repeat("]", 99),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := valid(data), json.Valid(data); got != want {
			t.Fatalf("valid(%q) = %v, json.Valid %v", data, got, want)
		}
	})
}

// BenchmarkValid: valid against json.Valid on /v1/allow's bodies, one
// check and four.
func BenchmarkValid(b *testing.B) {
	for name, body := range map[string][]byte{
		"one":  []byte(`{"rule":"bench","key":"user-1234","cost":1}`),
		"four": []byte(`{"checks":[{"rule":"bench","key":"a"},{"rule":"bench","key":"b","cost":2},{"rule":"bench","key":"c"},{"rule":"bench","key":"d"}],"max_wait_ms":50}`),
	} {
		for fn, valid := range map[string]func([]byte) bool{"valid": valid, "json.Valid": json.Valid} {
			b.Run(name+"/"+fn, func(b *testing.B) {
				for range b.N {
					if !valid(body) {
						b.Fatal("refused")
					}
				}
			})
		}
	}
}
