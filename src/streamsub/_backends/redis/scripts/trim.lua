-- Trim one partition's stream by the topic's retention policy, in one step.
-- KEYS[1]: the stream, KEYS[2]: the partition's dropped-unacked counter.
-- ARGV[1]: age cutoff id ("" = no age bound): entries below it are too old.
-- ARGV[2]: max length ("" = no length bound).
-- ARGV[3]: "1" = drop unacknowledged entries too (and count them), else
--          never trim past the safe point.
-- ARGV[4]: the most entries to delete in this step.
-- ARGV[5]: "1" = the server has XTRIM ... ACKED (Redis 8.2+): use it for the
--          safe case instead of reading the groups.
-- ARGV[6]: the floor ("" = none): nothing at or above it goes unless
--          dropping unacknowledged entries (what live snapshots still need).
-- Returns {deleted, of them unacknowledged, 1 when more remain to delete}.
--
-- The safe point is read here, in the step that trims: the lowest over all
-- groups of the first pending id, or of the id after the last delivered one
-- when nothing is pending. Entries below it every group has acknowledged.
local key, counter = KEYS[1], KEYS[2]
local cutoff, max_length = ARGV[1], tonumber(ARGV[2])
local drop, batch, acked = ARGV[3] == '1', tonumber(ARGV[4]), ARGV[5] == '1'
local floor = ARGV[6]
if redis.call('EXISTS', key) == 0 then return {0, 0, 0} end

local function parse(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  if am ~= bm then return am < bm end
  return as < bs
end
local function successor(id)
  local dash = string.find(id, '-', 1, true)
  return string.sub(id, 1, dash - 1) .. '-' .. string.format('%d', tonumber(string.sub(id, dash + 1)) + 1)
end
local function fields(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

if acked and not drop and floor == '' then
  local n = 0
  if cutoff ~= '' then n = n + redis.call('XTRIM', key, 'MINID', '=', cutoff, 'ACKED') end
  if max_length then n = n + redis.call('XTRIM', key, 'MAXLEN', '=', max_length, 'ACKED') end
  return {n, 0, 0}
end

local groups = {}
for _, raw in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  groups[#groups + 1] = fields(raw)
end

-- The upper bound: nothing at or above it goes (nil = no bound).
local upper = nil
if not drop then
  for _, g in ipairs(groups) do
    local needs
    if tonumber(g['pending']) > 0 then
      needs = redis.call('XPENDING', key, g['name'])[2]
    else
      needs = successor(g['last-delivered-id'])
    end
    if upper == nil or less(needs, upper) then upper = needs end
  end
  if floor ~= '' and (upper == nil or less(floor, upper)) then upper = floor end
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
  local bound = cutoff
  if upper ~= nil and less(upper, bound) then bound = upper end
  victims = redis.call('XRANGE', key, '-', range_end(bound), 'COUNT', batch)
end
if #victims < batch and excess > #victims then
  victims = redis.call('XRANGE', key, '-', range_end(upper), 'COUNT', math.min(excess, batch))
end
if #victims == 0 then return {0, 0, 0} end
local first, last = victims[1][1], victims[#victims][1]

local dropped = 0
if drop and #groups > 0 then
  -- Unacknowledged: not yet delivered to some group (above the lowest last
  -- delivered id), or pending in some group.
  local lowest = nil
  for _, g in ipairs(groups) do
    local ld = g['last-delivered-id']
    if lowest == nil or less(ld, lowest) then lowest = ld end
  end
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
  if dropped > 0 then redis.call('INCRBY', counter, dropped) end
end

local n = redis.call('XTRIM', key, 'MINID', '=', successor(last))
local more = 0
if #victims == batch then more = 1 end
return {n, dropped, more}
