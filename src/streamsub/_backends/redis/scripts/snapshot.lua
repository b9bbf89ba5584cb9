-- Record where a group stands on one partition for a snapshot, and hold back
-- retention there, in one step: a trim cannot run between the read and the
-- hold, so nothing the snapshot needs can go.
-- KEYS[1]: the stream, KEYS[2]: the partition's snapshot holds.
-- ARGV[1]: group, ARGV[2]: snapshot name, ARGV[3]: lifetime (ms),
-- ARGV[4]: the most pending ids to record.
-- Returns {'ok', last delivered id, now (server ms), expiry (server ms),
-- pending ids...}; {'toomany'} (more pending than that: no hold written);
-- {'exists'} (a live hold of that name); {'nogroup'}.
local key, holds = KEYS[1], KEYS[2]
local group, name, lifetime, most = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local held = redis.call('HGET', holds, name)
if held then
  local space = string.find(held, ' ', 1, true)
  if space ~= nil and tonumber(string.sub(held, space + 1)) > now_ms then return {'exists'} end
end
if redis.call('EXISTS', key) == 0 then return {'nogroup'} end
local last = nil
for _, raw in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  local g = {}
  for i = 1, #raw, 2 do g[raw[i]] = raw[i + 1] end
  if g['name'] == group then last = g['last-delivered-id'] end
end
if last == nil then return {'nogroup'} end
local pending = redis.call('XPENDING', key, group, '-', '+', most + 1)
if #pending > most then return {'toomany'} end
local needs = successor(last)
if #pending > 0 then needs = lower(needs, pending[1][1]) end
local expires = now_ms + lifetime
redis.call('HSET', holds, name, needs .. ' ' .. string.format('%d', expires))
local reply = {'ok', last, string.format('%d', now_ms), string.format('%d', expires)}
for _, p in ipairs(pending) do reply[#reply + 1] = p[1] end
return reply
