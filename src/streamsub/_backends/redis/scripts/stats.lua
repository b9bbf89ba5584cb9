-- Read what the operator's statistics need from one partition, in one step.
-- KEYS[1]: the stream.
-- ARGV[1]: the id where the publish-rate window starts, ARGV[2]: the most
-- entries counted in it, ARGV[3]: pending entries sampled per group for the
-- delivery-attempt distribution, ARGV[4]: the most undelivered entries
-- counted per group when the server does not know the lag.
-- Returns {length, entries in the window, groups}, each group as
-- {name, pending, last delivered id, backlog, first pending id or '',
--  first undelivered id or '', {consumer, pending, ...}, {delivery count, ...}}.
local key = KEYS[1]
local window_start, window_cap = ARGV[1], tonumber(ARGV[2])
local sample, backlog_cap = tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('EXISTS', key) == 0 then return {0, 0, {}} end
local length = redis.call('XLEN', key)
local recent = #redis.call('XRANGE', key, window_start, '+', 'COUNT', window_cap)
local groups = {}
for _, raw in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  local g = {}
  for i = 1, #raw, 2 do g[raw[i]] = raw[i + 1] end
  local name, ld = g['name'], g['last-delivered-id']
  local after = redis.call('XRANGE', key, '(' .. ld, '+', 'COUNT', 1)
  local first_undelivered = ''
  if #after > 0 then first_undelivered = after[1][1] end
  local backlog = g['lag']
  if type(backlog) ~= 'number' then
    if first_undelivered == '' then
      backlog = 0
    else
      backlog = #redis.call('XRANGE', key, '(' .. ld, '+', 'COUNT', backlog_cap)
    end
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
return {length, recent, groups}
