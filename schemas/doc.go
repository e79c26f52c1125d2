// Package schemas is the contract between processors: the protobuf record
// types (generated into surgev1 from proto/), their versions, and the topic
// registry that says which record travels on which topic under which key.
//
// Versioning: every record carries two headers, HeaderSchema (the protobuf
// full name, e.g. "surge.v1.LoginEvent") and HeaderVersion (a small integer).
// A reader accepts versions in [MinVersion, Version]; anything else goes to
// the dead-letter topic with the reason, never silently decoded. A breaking
// change gets a new proto package (surge.v2) and new topics; an additive
// change (new optional fields) bumps Version and keeps MinVersion.
package schemas
