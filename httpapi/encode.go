package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
)

// answer is a response body being built. Answers are pooled (answers):
// the buffer and the encoder writing into it serve the next response.
type answer struct {
	buf bytes.Buffer
	enc *json.Encoder
}

var answers = sync.Pool{New: func() any {
	a := new(answer)
	a.enc = json.NewEncoder(&a.buf)
	return a
}}

// jsonType is every answer's Content-Type, set by assigning it to the
// header map: Header.Set would canonicalise the name and allocate the
// slice on every answer. net/http only reads it.
var jsonType = []string{"application/json"}

// send writes a's body with status, and puts a back.
func (a *answer) send(w http.ResponseWriter, status int) {
	w.Header()["Content-Type"] = jsonType
	w.WriteHeader(status)
	_, _ = w.Write(a.buf.Bytes())
	if a.buf.Cap() <= maxPooledBody {
		answers.Put(a)
	}
}

func newAnswer() *answer {
	a := answers.Get().(*answer)
	a.buf.Reset()
	return a
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	a := newAnswer()
	_ = a.enc.Encode(v)
	a.send(w, status)
}

// writeAllow answers one decision; writeAllowAll the checks form. Both
// write what writeJSON would (TestAppendAllow holds them to it), without
// reflection.
func writeAllow(w http.ResponseWriter, r AllowResponse) {
	a := newAnswer()
	a.buf.Write(appendAllow(a.buf.AvailableBuffer(), r))
	a.buf.WriteByte('\n')
	a.send(w, http.StatusOK)
}

func writeAllowAll(w http.ResponseWriter, r MultiAllowResponse) {
	a := newAnswer()
	a.buf.Write(appendAllowAll(a.buf.AvailableBuffer(), r))
	a.buf.WriteByte('\n')
	a.send(w, http.StatusOK)
}

func appendAllow(b []byte, r AllowResponse) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, r.Allowed)
	b = append(b, `,"limit":`...)
	b = strconv.AppendUint(b, r.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendUint(b, r.Remaining, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, r.ResetAfterMs, 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, r.RetryAfterMs, 10)
	b = append(b, `,"reason":`...)
	b = appendString(b, r.Reason)
	return append(b, '}')
}

func appendAllowAll(b []byte, r MultiAllowResponse) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, r.Allowed)
	b = append(b, `,"results":`...)
	if r.Results == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, res := range r.Results {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendAllow(b, res)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendString appends s as encoding/json writes it: a reason's name
// (letters and _) as it is, anything else through encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
