// Package staging moves a job's data between object storage and the node
// it runs on: inputs into a node-local content-addressed cache before the
// job starts, outputs back after it ends, and its checkpoint directory to
// and from object storage so that any attempt, on any machine, resumes
// from the last committed checkpoint.
//
// Object stores: s3:// through aws-sdk-go-v2 with the node's credential
// chain (an endpoint may be set for S3-compatible servers), gs:// through
// Google Cloud Storage's S3-compatible XML API (HMAC keys, endpoint
// https://storage.googleapis.com by default), and https:// for plain
// downloads.
package staging
