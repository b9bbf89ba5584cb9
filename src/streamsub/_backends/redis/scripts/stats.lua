-- Read what the operator's statistics need from one partition, in one step,
-- reading at most ARGV[2] + ARGV[4] + 1 entries (with their payloads) and
-- ARGV[3] pending records per group, whatever the stream's length.
-- KEYS[1]: the stream.
-- ARGV[1]: the publish-rate window (ms, ending now by the server's clock),
-- ARGV[2]: the newest entries read for it at most (when the window holds
-- more, the rate is their count over the time they span), ARGV[3]: pending
-- entries sampled per group for the delivery-attempt distribution, ARGV[4]:
-- the most undelivered entries counted per group when the server does not
-- know the lag (a floor then).
-- Returns {length, entries counted for the rate, the ms they span, now (server
-- ms), groups}, each group as {name, pending, last delivered id, backlog,
-- first pending id or '', first undelivered id or '', {consumer, pending, ...},
-- {delivery count, ...}}.
local key = KEYS[1]
local window, rate_sample = tonumber(ARGV[1]), tonumber(ARGV[2])
local sample, backlog_cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if redis.call('EXISTS', key) == 0 then return {0, 0, window, now, {}} end
local length = redis.call('XLEN', key)
local window_start = string.format('%d', math.max(0, now - window)) .. '-0'
local newest = redis.call('XREVRANGE', key, '+', window_start, 'COUNT', rate_sample)
local recent, span = #newest, window
if recent == rate_sample and recent > 0 then
  local id = newest[recent][1]
  local oldest_ms = tonumber(string.sub(id, 1, string.find(id, '-', 1, true) - 1))
  span = math.max(1, now - oldest_ms)
end
local first_entry = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)
local groups = {}
for _, raw in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  local g = {}
  for i = 1, #raw, 2 do g[raw[i]] = raw[i + 1] end
  local name, ld = g['name'], g['last-delivered-id']
  local after = redis.call('XRANGE', key, '(' .. ld, '+', 'COUNT', 1)
  local first_undelivered = ''
  if #after > 0 then first_undelivered = after[1][1] end
  -- Exact where the stream says so before the server's lag: after a hard cap
  -- trimmed entries the group never read, Redis 7.0 still counts them in lag.
  local backlog = g['lag']
  if first_undelivered == '' then
    backlog = 0
  elseif first_undelivered == first_entry[1][1] then
    backlog = length  -- nothing left in the stream was delivered yet: exact
  elseif type(backlog) ~= 'number' then
    backlog = #redis.call('XRANGE', key, '(' .. ld, '+', 'COUNT', backlog_cap)
  end
  local first_pending, consumers, attempts = '', {}, {}
  if g['pending'] > 0 then
    local summary = redis.call('XPENDING', key, name)
    first_pending = summary[2]
    for _, c in ipairs(summary[4]) do
      consumers[#consumers + 1] = c[1]
      consumers[#consumers + 1] = c[2]
    end
    for _, p in ipairs(redis.call('XPENDING', key, name, '-', '+', sample)) do
      attempts[#attempts + 1] = p[4]
    end
  end
  groups[#groups + 1] = {
    name, g['pending'], ld, backlog, first_pending, first_undelivered, consumers, attempts
  }
end
return {length, recent, span, now, groups}
