package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"

	"github.com/spillway-dev/spillway/broker"
)

// BucketIdempotency maps "<caller>/<Idempotency-Key>" to the job a submit
// with that key created, so a client that lost the answer (a timeout, a
// broker killed mid-request) can send the same submit again and get the
// same job instead of a second one.
const BucketIdempotency broker.Bucket = "idempotency"

// HeaderIdempotencyKey names the submit's idempotency key.
const HeaderIdempotencyKey = "Idempotency-Key"

// idemKeyRe is what an idempotency key may be: the CLI sends 32 hex digits.
var idemKeyRe = regexp.MustCompile(`^[A-Za-z0-9._:-]{8,128}$`)

// idemRecord is a stored idempotency key: the job it made and a hash of
// the body, so the same key with another spec is refused.
type idemRecord struct {
	Job  string `json:"job"`
	Body string `json:"body"`
}

func idemStoreKey(caller, key string) string { return caller + "/" + key }

func bodyHash(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:16])
}

// checkIdemKey validates the header value ("" when absent).
func checkIdemKey(key string) error {
	if key == "" || idemKeyRe.MatchString(key) {
		return nil
	}
	return errBadRequest(HeaderIdempotencyKey, broker.CodeInvalid, "header must be 8-128 letters, digits, '.', '_', ':' or '-'")
}

// priorSubmit looks up key in tx: the job an earlier submit with the same
// key and body created (nil when none), or a 409 when the body differs.
func priorSubmit(tx broker.Tx, caller, key, hash string) (*broker.Job, error) {
	v, err := tx.Get(BucketIdempotency, idemStoreKey(caller, key))
	if errors.Is(err, broker.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec idemRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, err
	}
	if rec.Body != hash {
		return nil, newError(http.StatusConflict, "idempotency_key_reused",
			"Idempotency-Key %s was used for another spec (job %s); use a new key for a new job", key, rec.Job)
	}
	return broker.GetJob(tx, rec.Job)
}

// encodeIdem is the record putIdem writes: the job a key made and its
// body's hash (bodyHash), encoded before the transaction.
func encodeIdem(job, hash string) ([]byte, error) {
	return json.Marshal(idemRecord{Job: job, Body: hash})
}

func putIdem(tx broker.Tx, caller, key string, rec []byte) error {
	return tx.Put(BucketIdempotency, idemStoreKey(caller, key), rec)
}

// seenIdemKey reports whether caller used key before (so a resend is not
// rate-limited as a new submit).
func (s *Server) seenIdemKey(ctx context.Context, caller, key string) bool {
	seen := false
	_ = s.store.View(ctx, func(tx broker.Tx) error {
		_, err := tx.Get(BucketIdempotency, idemStoreKey(caller, key))
		seen = err == nil
		return nil
	})
	return seen
}
