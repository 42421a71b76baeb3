// Package api holds the request and response bodies of the broker's HTTP
// API (docs/openapi.yaml): the server encodes them and the client decodes
// them, so the client needs nothing of the server.
package api
