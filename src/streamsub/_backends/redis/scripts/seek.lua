-- Move a group on one partition and settle its pending entries, in one step.
-- KEYS[1]: the stream, KEYS[2]: the group's delay set, KEYS[3]: its
-- delivery-time records.
-- ARGV[1]: group, ARGV[2]: the new last-delivered id ('$' = the end),
-- ARGV[3]: the consumer that holds entries to deliver again, ARGV[4]: the idle
-- time (ms) they get, so that any reclaimer takes them at once,
-- ARGV[5..]: pending-then ids to deliver again (from a snapshot).
-- Pending entries at or below the new position that are not to be delivered
-- again are acknowledged; those above it stay pending and are delivered again
-- by the next reads (Redis gives them to the reader with count 1).
-- Returns {acknowledged, made pending again}.
local key, delays, times = KEYS[1], KEYS[2], KEYS[3]
local group, position, consumer, idle = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local again = {}
for i = 5, #ARGV do again[ARGV[i]] = true end
redis.call('XGROUP', 'SETID', key, group, position)
local upper = position
if position == '$' then upper = '+' end
local acked, start = 0, '-'
while true do
  local page = redis.call('XPENDING', key, group, start, upper, 1000)
  if #page == 0 then break end
  local ids = {}
  for _, p in ipairs(page) do
    if not again[p[1]] then ids[#ids + 1] = p[1] end
  end
  if #ids > 0 then
    acked = acked + redis.call('XACK', key, group, unpack(ids))
    redis.call('HDEL', times, unpack(ids))
    redis.call('ZREM', delays, unpack(ids))
  end
  if #page < 1000 then break end
  start = '(' .. page[#page][1]
end
local restored = 0
for i = 5, #ARGV do
  local id = ARGV[i]
  if #redis.call('XRANGE', key, id, id) > 0 then
    redis.call('XCLAIM', key, group, consumer, 0, id, 'IDLE', idle, 'RETRYCOUNT', 0, 'FORCE', 'JUSTID')
    redis.call('ZREM', delays, id)
    restored = restored + 1
  end
end
return {acked, restored}
