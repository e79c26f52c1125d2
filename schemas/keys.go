package schemas

import "encoding/binary"

// MaxUin is the largest valid uin: uins are 32-bit account numbers.
const MaxUin = 1<<32 - 1

// UinKey is the record key of every uin-keyed topic (push.login,
// push.presence, push.offline, uin.*): the uin as 4 bytes big-endian, so
// topics keyed by uin stay co-partitioned.
func UinKey(uin uint32) []byte { return binary.BigEndian.AppendUint32(nil, uin) }
