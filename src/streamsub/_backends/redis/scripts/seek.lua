-- One step of moving a group on one partition; a seek is several such steps,
-- each bounded, so that no step blocks Redis for long whatever the number of
-- pending entries (100,000 pending once took 1.5 s in a single step).
-- KEYS[1]: the stream, KEYS[2]: the group's delay set, KEYS[3]: its
-- delivery-time records, KEYS[4]: the ids this seek makes pending again (a set
-- that lives for the seek, so the acknowledging steps skip them), KEYS[5]: the
-- partition's fence (fence.lua; it exists on ordered subscriptions only).
-- ARGV[1]: group, ARGV[2]: the step:
--   'restore' (snapshot seeks, first): ARGV[3]: the consumer that holds the
--     entries to deliver again, ARGV[4]: the idle time (ms) they get so that
--     any reclaimer takes them at once, ARGV[5..]: pending-then ids. Returns
--     {0, made pending again, ''}.
--   'set': ARGV[3]: the new last-delivered id ('$' = the end), ARGV[4]: '1'
--     if 'restore' made entries pending again here: then a fence, where there
--     is one, is raised by one, above the token of the partition's owner, in
--     the same step that moves the group back. Its reads and sweeps are
--     refused from then on; it gives the partition up, and the next owner
--     (its token is at least the server clock and above the last token
--     handed out, so at least the raised fence) takes over everything
--     pending there, the restored entries included, before it reads the
--     entries after the position: no key's newer message overtakes an older
--     one made pending again. Returns {0, 0, the position set (the end's id
--     for '$')}.
--   'ack': ARGV[3]: the new position, ARGV[4]: the cursor ('-' or '(' .. id),
--     ARGV[5]: the most pending entries to look at in this step. Pending
--     entries at or below the position, except those made pending again, are
--     acknowledged; those above it stay pending and are delivered again by the
--     next reads (Redis gives them to the reader with count 1). Returns
--     {acknowledged, 0, the next cursor or '' when done}.
--   'done': forget the set of ids made pending again. Returns {0, 0, ''}.
local key, delays, times, again, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, step = ARGV[1], ARGV[2]
if step == 'restore' then
  local consumer, idle, restored = ARGV[3], ARGV[4], 0
  for i = 5, #ARGV do
    local id = ARGV[i]
    if #redis.call('XRANGE', key, id, id) > 0 then
      redis.call('XCLAIM', key, group, consumer, 0, id, 'IDLE', idle, 'RETRYCOUNT', 0, 'FORCE', 'JUSTID')
      redis.call('ZREM', delays, id)
      redis.call('SADD', again, id)
      restored = restored + 1
    end
  end
  redis.call('EXPIRE', again, 3600)
  return {0, restored, ''}
elseif step == 'set' then
  -- '$' becomes the concrete last id, so that the acknowledging steps never
  -- reach entries delivered after the seek, between two steps.
  local position = ARGV[3]
  if position == '$' then
    local info = redis.call('XINFO', 'STREAM', key)
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then position = info[i + 1] end
    end
  end
  redis.call('XGROUP', 'SETID', key, group, position)
  if ARGV[4] == '1' and redis.call('EXISTS', fence) == 1 then
    redis.call('INCR', fence)
  end
  return {0, 0, position}
elseif step == 'done' then
  redis.call('DEL', again)
  return {0, 0, ''}
end
local upper, cursor, most = ARGV[3], ARGV[4], tonumber(ARGV[5])
local acked, seen = 0, 0
while seen < most do
  local page = redis.call('XPENDING', key, group, cursor, upper, math.min(1000, most - seen))
  if #page == 0 then return {acked, 0, ''} end
  seen = seen + #page
  local ids = {}
  for _, p in ipairs(page) do
    if redis.call('SISMEMBER', again, p[1]) == 0 then ids[#ids + 1] = p[1] end
  end
  if #ids > 0 then
    acked = acked + redis.call('XACK', key, group, unpack(ids))
    redis.call('HDEL', times, unpack(ids))
    redis.call('ZREM', delays, unpack(ids))
  end
  cursor = '(' .. page[#page][1]
end
return {acked, 0, cursor}
