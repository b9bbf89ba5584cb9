-- An ordered subscription's read of partitions the reader owns: for each, only
-- if the partition's fence (fence.lua) holds the reader's fencing token, the
-- new entries (XREADGROUP >, never blocking), so that a read that reaches the
-- server after the partition moved on (held in the network, or sent late by a
-- stalled owner) takes nothing that is another's now.
-- KEYS: stream, fence, per partition. ARGV[1]: group, ARGV[2]: consumer,
-- ARGV[3]: count (per partition), ARGV[4..]: the token per partition.
-- Returns {fenced, read, last}: "fenced" the (1-based) partitions whose fence
-- holds another token (nothing was read there); "read" {i, entries, ...} for
-- partitions with new entries; "last" {i, id, ...} for the others read: the
-- stream's last entry id ("0-0" if none), from which a non-group XREAD can wait
-- for the next one.
local group, consumer, count = ARGV[1], ARGV[2], ARGV[3]
local fenced, read, last = {}, {}, {}
for i = 1, #KEYS / 2 do
  local stream, fence = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('GET', fence) ~= ARGV[3 + i] then
    fenced[#fenced + 1] = i
  else
    local reply = redis.call(
      'XREADGROUP', 'GROUP', group, consumer, 'COUNT', count, 'STREAMS', stream, '>')
    if reply and reply[1] and #reply[1][2] > 0 then
      read[#read + 1] = i
      read[#read + 1] = reply[1][2]
    else
      local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
      last[#last + 1] = i
      last[#last + 1] = newest[1] and newest[1][1] or '0-0'
    end
  end
end
return {fenced, read, last}
