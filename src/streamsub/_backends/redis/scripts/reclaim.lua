-- Claim, for this consumer, the entries of one partition idle for at least
-- min-idle: a crashed or hung consumer's, or nacked ones whose backoff passed.
-- KEYS[1]: the stream, KEYS[2]: the subscription's delay set (nacks delayed
-- longer than min-idle; score = when due, ms), KEYS[3]: its delivery-time
-- records.
-- ARGV: group, consumer, min-idle ms, start ("-" on a sweep's first call, then
-- the cursor returned), count (entries to take at most), max delivery attempts
-- (0 = no limit), ids to leave alone, separated by spaces (this consumer's
-- handlers still hold them, or their acks are on the way: claiming them would
-- count a delivery that is not), "1" to take parked nacks before they are due
-- (a new owner of an ordered subscription's partition takes everything, so
-- that no later message of a key overtakes a nacked one).
-- Nacks delayed past min-idle wait parked under the consumer
-- 'streamsub.delayed' (see nack.lua): the scan passes over them by name, at no
-- cost per entry; on a sweep's first call the due ones are read from the delay
-- set (ZRANGEBYSCORE up to now) and taken while still parked (after a seek
-- back a reader may hold one again: its delay is stale and dropped). An entry idle under another consumer
-- is checked against the delay set (one ZSCORE), for entries delayed by older
-- versions. The scan reads up to max(count, 100) pending entries a call, so
-- entries passed over do not cost a round trip each when count is small.
-- Returns {cursor ("0-0" when done), items}; each item is
-- {id, fields or false, delivery count, first delivery ms, last delivery ms, state}
-- with state 0 = deliver (its count was incremented), 1 = exhausted (held for
-- dead-lettering, count unchanged), 2 = lost (trimmed while pending; now acked).
-- With KEYS[4] (an ordered subscription's partition fence, see fence.lua) and
-- ARGV[9] (the sweeper's fencing token), the sweep runs only while the fence
-- holds that token, and returns {'fenced', {}} otherwise: a deposed owner's
-- sweep takes nothing from the new owner.
-- On an ordered subscription the sweep also passes over entries above the
-- group's last-delivered id (pending there after a seek back): a read
-- delivers them again, in stream order; taken by a sweep they would overtake
-- the older entries of their key that the read has not reached yet.
if KEYS[4] and redis.call('GET', KEYS[4]) ~= ARGV[9] then
  return {'fenced', {}}
end
local key, delays, times = KEYS[1], KEYS[2], KEYS[3]
local group, consumer = ARGV[1], ARGV[2]
local min_idle, start = tonumber(ARGV[3]), ARGV[4]
local count, max_attempts = tonumber(ARGV[5]), tonumber(ARGV[6])
local PARKED = 'streamsub.delayed'
local skip = {}
for id in string.gmatch(ARGV[7] or '', '%S+') do skip[id] = true end
local take_parked = ARGV[8] == '1'
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local items = {}
local upto = '+'
if KEYS[4] then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    for i = 1, #g, 2 do
      if g[i] == 'name' and g[i + 1] ~= group then break end
      if g[i] == 'last-delivered-id' then upto = g[i + 1] end
    end
  end
end

local function take(id, idle, delivered)
  local record = redis.call('HGET', times, id)
  local first, last = now - idle, now - idle
  if record then
    local sep = string.find(record, ':', 1, true)
    first = tonumber(string.sub(record, 1, sep - 1))
    last = tonumber(string.sub(record, sep + 1))
  end
  local entry = redis.call('XRANGE', key, id, id)
  if #entry == 0 then
    redis.call('XACK', key, group, id)
    redis.call('HDEL', times, id)
    items[#items + 1] = {id, false, delivered, first, last, 2}
  elseif max_attempts > 0 and delivered >= max_attempts then
    redis.call('XCLAIM', key, group, consumer, 0, id, 'JUSTID')
    items[#items + 1] = {id, entry[1][2], delivered, first, last, 1}
  else
    local claimed = redis.call('XCLAIM', key, group, consumer, 0, id)
    if claimed[1] then
      items[#items + 1] = {id, claimed[1][2], delivered + 1, first, last, 0}
    end
  end
end

if start == '-' then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', delays, '-inf', now, 'LIMIT', 0, count)) do
    if not skip[id] then
      redis.call('ZREM', delays, id)
      -- (Above the position its delay is moot: the read delivers it again.)
      local p = nil
      if upto == '+' or not less(upto, id) then
        p = redis.call('XPENDING', key, group, id, id, 1)[1]
      end
      -- Only while still parked (or idle past min-idle: a delay of an older
      -- version): after a seek back a reader may hold the entry again, and a
      -- stale delay must not take it from under its running handler.
      if p and (p[2] == PARKED or p[3] >= min_idle) then take(id, p[3], p[4]) end
    end
  end
end

local cursor = '0-0'
local page = math.max(count, 100)
local pending = redis.call('XPENDING', key, group, 'IDLE', min_idle, start, upto, page)
for i, p in ipairs(pending) do
  if #items >= count then
    cursor = (i == 1) and start or ('(' .. pending[i - 1][1])
    break
  end
  local id, owner = p[1], p[2]
  if (take_parked or owner ~= PARKED) and not skip[id] then
    local due = redis.call('ZSCORE', delays, id)
    if take_parked or not (due and tonumber(due) > now) then
      if due then redis.call('ZREM', delays, id) end
      take(id, p[3], p[4])
    end
  end
end
if cursor == '0-0' and #pending >= page then
  cursor = '(' .. pending[#pending][1]
end
return {cursor, items}
