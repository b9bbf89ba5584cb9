-- Trim one partition's stream by the topic's retention policy, in one step.
-- KEYS[1]: the stream, KEYS[2]: the partition's dropped-unacked counter,
-- KEYS[3]: the partition's snapshot holds (a hash: snapshot name ->
--          "<lowest id it needs> <expiry, server ms>").
-- ARGV[1]: max age in ms ("" = no age bound): entries older than that by the
--          server's clock (TIME) are too old.
-- ARGV[2]: max length ("" = no length bound).
-- ARGV[3]: "1" = drop unacknowledged entries too (and count them), else
--          never trim past the safe point.
-- ARGV[4]: the most entries to delete in this step.
-- ARGV[5]: "1" = the server has XTRIM ... ACKED (Redis 8.2+): let it decide
--          which entries every group has acknowledged.
-- ARGV[6]: a floor ("" = none): nothing at or above it goes unless dropping
--          unacknowledged entries (what snapshot records still need).
-- ARGV[7]: "1" = the topic is a dead-letter topic: while no group reads it,
--          every entry deleted is an unresolved dead letter and is counted.
-- Returns {deleted, of them unacknowledged, 1 when more remain to delete}.
--
-- The safe point is read here, in the step that trims: the lowest over all
-- groups of the first pending id and of the id after the last delivered one
-- (after a seek backwards the latter is the lower), and over the live
-- snapshot holds. Entries below it every group has acknowledged.
--
-- Ids are compared as text (_ids.lua, prepended when the script is loaded).
local key, counter, holds_key = KEYS[1], KEYS[2], KEYS[3]
local max_length = tonumber(ARGV[2])
local drop, batch, acked = ARGV[3] == '1', tonumber(ARGV[4]), ARGV[5] == '1'
local floor, dead = ARGV[6], ARGV[7] == '1'
if redis.call('EXISTS', key) == 0 then return {0, 0, 0} end

local function fields(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local cutoff = ''
if ARGV[1] ~= '' then
  cutoff = string.format('%d', math.max(0, math.floor(now_ms - tonumber(ARGV[1])))) .. '-0'
end

local groups = {}
for _, raw in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  groups[#groups + 1] = fields(raw)
end
local server_decides = acked and not drop and #groups > 0

-- The groups' safe point (nil without groups): below it every group has
-- acknowledged every entry.
local safe = nil
for _, g in ipairs(groups) do
  safe = lower(safe, successor(g['last-delivered-id']))
  if tonumber(g['pending']) > 0 then
    safe = lower(safe, redis.call('XPENDING', key, g['name'])[2])
  end
end

-- The upper bound: nothing at or above it goes (nil = no bound).
local upper = nil
if not drop then
  local holds = redis.call('HGETALL', holds_key)
  for i = 1, #holds, 2 do
    local value = holds[i + 1]
    local space = string.find(value, ' ', 1, true)
    if space == nil or tonumber(string.sub(value, space + 1)) <= now_ms then
      redis.call('HDEL', holds_key, holds[i])
    else
      upper = lower(upper, string.sub(value, 1, space - 1))
    end
  end
  if floor ~= '' then upper = lower(upper, floor) end
  if not server_decides then upper = lower(upper, safe) end
end

-- The victims: the oldest entries that are beyond the policy (too old, or
-- more than max_length), below the upper bound, at most `batch` of them.
local excess = 0
if max_length then excess = redis.call('XLEN', key) - max_length end
local function range_end(bound)
  if bound == nil then return '+' end
  return '(' .. bound
end
local victims = {}
if cutoff ~= '' then
  victims = redis.call('XRANGE', key, '-', range_end(lower(upper, cutoff)), 'COUNT', batch)
end
if #victims < batch and excess > #victims then
  victims = redis.call('XRANGE', key, '-', range_end(upper), 'COUNT', math.min(excess, batch))
end
if #victims == 0 then return {0, 0, 0} end
local first, last = victims[1][1], victims[#victims][1]

if server_decides then
  -- Bounded by this step's victims, so one step deletes at most `batch`.
  local n = redis.call('XTRIM', key, 'MINID', '=', successor(last), 'ACKED')
  -- Redis 8.2.3 and older keep a destroyed group's last delivered id cached
  -- (redis/redis#14552), so ACKED may keep entries that every remaining group
  -- has acknowledged, on that stream for good: below the safe point read
  -- here they go anyway.
  n = n + redis.call('XTRIM', key, 'MINID', '=', lower(successor(last), safe))
  local more = 0
  if #victims == batch and n > 0 then more = 1 end
  return {n, 0, more}
end

local dropped = 0
if dead and #groups == 0 then
  -- Nobody reads the dead-letter topic: each entry is an unresolved dead letter.
  dropped = #victims
elseif drop and #groups > 0 then
  -- Unacknowledged: not yet delivered to some group (above the lowest last
  -- delivered id), or pending in some group.
  local lowest = nil
  for _, g in ipairs(groups) do lowest = lower(lowest, g['last-delivered-id']) end
  local unacked = {}
  for _, v in ipairs(victims) do
    if less(lowest, v[1]) then unacked[v[1]] = true end
  end
  local present = {}
  for _, v in ipairs(victims) do present[v[1]] = true end
  for _, g in ipairs(groups) do
    if tonumber(g['pending']) > 0 then
      local pending = redis.call('XPENDING', key, g['name'], first, last, batch)
      local ids = {}
      for _, p in ipairs(pending) do
        if present[p[1]] then unacked[p[1]] = true end
        ids[#ids + 1] = p[1]
      end
      -- Dropped entries leave the pending list too: counted here, once.
      -- (In chunks: Lua's unpack has a limit of a few thousand values.)
      for i = 1, #ids, 1000 do
        redis.call('XACK', key, g['name'], unpack(ids, i, math.min(i + 999, #ids)))
      end
    end
  end
  for _ in pairs(unacked) do dropped = dropped + 1 end
end
if dropped > 0 then redis.call('INCRBY', counter, dropped) end

local n = redis.call('XTRIM', key, 'MINID', '=', successor(last))
local more = 0
if #victims == batch then more = 1 end
return {n, dropped, more}
