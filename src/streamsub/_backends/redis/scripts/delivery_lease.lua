-- Set the lease of deliveries named by their ack ids (the Pub/Sub gateway's
-- ModifyAckDeadline): the entry's idle time becomes the given value, so that
-- reclaimers with min-idle M take it (M - idle) ms from now. Owner- and
-- count-checked like delivery_ack.lua; the delivery count is not changed.
-- KEYS[1]: the stream. ARGV: group, then for each delivery: id, consumer,
-- delivery count, idle ms. Returns the ids whose lease was set.
local key, group = KEYS[1], ARGV[1]
local set = {}
for i = 2, #ARGV, 4 do
  local id, consumer = ARGV[i], ARGV[i + 1]
  local pending = redis.call('XPENDING', key, group, id, id, 1)
  if pending[1] and pending[1][2] == consumer and pending[1][4] == tonumber(ARGV[i + 2]) then
    redis.call('XCLAIM', key, group, consumer, 0, id, 'IDLE', tonumber(ARGV[i + 3]), 'JUSTID')
    set[#set + 1] = id
  end
end
return set
