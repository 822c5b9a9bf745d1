-- Sluice: one atomic decision over all the limits of a policy for one key.
--
-- Mirrors crates/sluice-core/src/algorithms.rs and evaluate.rs field for field; a differential
-- test holds the two identical. Loaded once, either as a Redis Function library (FUNCTION LOAD;
-- functions __LIB___check, __LIB___peek, __LIB___refund, __LIB___acquire, __LIB___hold,
-- __LIB___release, and the lean ones __LIB___rate, __LIB___rate_ro and __LIB___batch) or as
-- one script per operation for EVALSHA whose last line calls `run` with the operation.
-- `__LIB__` is replaced by the library's versioned name when loaded.
--
-- Checks and peeks of policies without a concurrency limit take the lean path (`rate`, its
-- layout documented in its own section below) or, coalesced, a `batch`; every other operation
-- takes the general path, whose layout follows.
--
-- KEYS[i]   the state of limit i of the policy, in the policy's order (`acquire` adds the
--           holders set; a policy with a concurrency limit adds that limit's units hash,
--           always last). All share one hash tag, so the script runs on Redis Cluster too
--           (keys.rs names them).
-- ARGV[1]   now in ms since the epoch, or "redis" to read Redis TIME inside the script
-- ARGV[2]   cost (0 to 2^53)
-- ARGV[3]   expiry margin in ms: a key expires this long after its state stops mattering
-- ARGV[4]   n, the number of limits (#KEYS less the keys added above)
-- then 9 values per limit i, from 5 + 9*(i-1) (listed below),
-- and for `acquire` only, ARGV[5 + 9*n]: the most units to take (the cost is the least),
-- ARGV[6 + 9*n] the holder id ("0": anonymous) and ARGV[7 + 9*n] how long (ms) a holder
-- counts after its last acquire; KEYS[n + 1] is then the key's holders set (a sorted set:
-- member holder id, score the instant it stops counting).
-- For `hold` and `release` only, ARGV[5 + 9*n] is the lease id (a decimal u64, kept a string:
-- a Lua number would round it).
--   algorithm  1 fixed_window, 2 fixed_window aligned, 3 sliding_window, 4 token_bucket,
--              5 concurrency (per: the lease TTL)
--   max, per (ms), precision (ms; sliding), burst (bucket)
--   tau_ms, tau_frac    (bucket) burst*per/max as whole ms + a numerator over max
--   step_ms, step_frac  (bucket) cost*per/max likewise (`acquire`: 1*per/max, scaled here)
-- The Rust caller computes tau and step exactly (128-bit); Lua numbers are doubles, exact only
-- up to 2^53, so every computation below stays under 2^53 or is split into 16-bit limbs.
--
-- Stored state (hashes, but for the concurrency limit's own key and a fixed window's counter):
--   fixed_window    KEYS[i] = <stem>:fw<per>:c<ARGV[3]> (the margin in ms, as sent, is in
--                   the name: no process reads a window with another margin than it was
--                   written with), in one of two encodings chosen when the window opens (see
--                   "fixed windows" below): a counter, a string integer `used` whose absolute
--                   expiry (SET PXAT) is the window's end + margin, so reset = PEXPIRETIME -
--                   margin; or, opened by a caller whose clock is off Redis's by half the
--                   margin or more, a hash: reset, used (reset stored when the window opens,
--                   never recomputed; PEXPIRE reset - now + margin). Every path reads both.
--   sliding_window  <bucket start> -> n (one field per non-empty bucket)
--   token_bucket    tat, frac           (theoretical arrival time = tat + frac/max ms)
--   concurrency     a sorted set, member lease id, score its expiry; and the units hash,
--                   <lease id> -> cost, and used (the total cost of the leases in the set).
--                   Lapsed leases are not counted by any read (only they are read: a decision
--                   never reads the whole set) and are deleted by the next write.
-- Key expiry (PEXPIRE, relative to `now`, + margin) only cleans up: every read compares the
-- stored times with `now`, so a closed window that still exists is treated as closed. A
-- fixed window's counter is the exception: its absolute expiry is its end.
--
-- Reply: { allowed (0/1), now, then per limit: admits (0/1), remaining, reset_ms,
--          retry_after_ms (-1 = never) }; `acquire` appends the amount it decided on and
--          the number of holders counting (this one included; 0 when anonymous); `release`
--          appends the units the lease held (0: not held).

-- Redis loads a function library in a sandbox without the standard libraries: they are
-- reached at call time, never captured at load time.
local function floor(x)
  return math.floor(x)
end
local TWO53 = 9007199254740992

local function fmt(n)
  return string.format('%d', n)
end

-- floor(a / b) for integers a, b with a < 2^53, exact (the double quotient may round up).
local function idiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

local function corrupt(key, what)
  error({err = 'SLUICE_CORRUPT ' .. key .. ': ' .. what}, 0)
end

-- Raises again what a `pcall` caught: an error reply (a table) as it is, a message (what a
-- failed `redis.call` or a Lua error leaves) as an error reply whose first word stays its
-- code (`error(message)` would prefix `ERR`), so the caller classifies it as it would the
-- same failure uncaught.
local function rethrow(e)
  if type(e) == 'table' then
    error(e, 0)
  end
  error({err = tostring(e)}, 0)
end

-- Stored state as Redis itself reads an integer (INCRBY, HINCRBY: digits only, no sign, no
-- leading zero, no space), here also at most 2^53: `v` as a number, or nil when it is not
-- one. Lua's `tonumber` alone takes `0x1`, ` 5`, `1e3`, `05` and `1.0`, which a later INCRBY
-- or HINCRBY would refuse halfway through a decision's writes.
local function as_int(v)
  local n = tonumber(v)
  if n == nil or n < 0 or n % 1 ~= 0 or n > TWO53 then
    return nil
  end
  if type(v) == 'string' and v ~= '0' and not string.find(v, '^[1-9]%d*$') then
    return nil
  end
  return n
end

-- An integer field, or nil when absent; anything else is corrupt state.
local function int_field(key, name, v)
  if v == false or v == nil then
    return nil
  end
  local n = as_int(v)
  if n == nil then
    corrupt(key, 'field ' .. name .. ' holds ' .. tostring(v) .. ', not an integer')
  end
  return n
end

-- `redis.call(cmd, key, ...)` with the values of `list` as its last arguments, at most CHUNK
-- at once (Lua's `unpack` fails beyond about 8,000 values); the replies, concatenated.
local CHUNK = 1000
local function call_chunked(cmd, key, list)
  local out = {}
  for i = 1, #list, CHUNK do
    local last = i + CHUNK - 1
    if last > #list then
      last = #list
    end
    local r = redis.call(cmd, key, unpack(list, i, last))
    if type(r) == 'table' then
      for j = 1, #r do
        out[#out + 1] = r[j]
      end
    end
  end
  return out
end

-- ----- 16-bit limbs: floor((x*y + z) / d) for x, y, z < 2^53+1, d < 2^36 -----------------

local B = 65536

local function limbs(n)
  local t = {}
  for i = 1, 4 do
    local q = floor(n / B)
    t[i] = n - q * B
    n = q
  end
  return t
end

local function muladd_div(x, y, z, d)
  local p = x * y + z
  if p < 4503599627370496 then -- 2^52: exact in a double
    return idiv(p, d)
  end
  local a, b, c = limbs(x), limbs(y), limbs(z)
  local r = {0, 0, 0, 0, 0, 0, 0, 0}
  for i = 1, 4 do
    r[i] = r[i] + c[i]
    for j = 1, 4 do
      r[i + j - 1] = r[i + j - 1] + a[i] * b[j]
    end
  end
  for i = 1, 7 do -- carry: every sum above is below 2^35
    local q = floor(r[i] / B)
    r[i] = r[i] - q * B
    r[i + 1] = r[i + 1] + q
  end
  local rem, q = 0, 0
  for i = 8, 1, -1 do -- long division by d < 2^36: rem*B + limb < 2^52
    local cur = rem * B + r[i]
    local qi = idiv(cur, d)
    rem = cur - qi * d
    q = q * B + qi
  end
  return q
end

-- ----- time pairs (ms, frac/max) for the token bucket --------------------------------------

local function pair_gt(ams, af, bms, bf)
  return ams > bms or (ams == bms and af > bf)
end

local function pair_add(ams, af, bms, bf, m)
  if af >= m - bf then
    return ams + bms + 1, af - (m - bf)
  end
  return ams + bms, af + bf
end

-- a - b for a >= b
local function pair_sub(ams, af, bms, bf, m)
  if af >= bf then
    return ams - bms, af - bf
  end
  return ams - bms - 1, af + (m - bf)
end

-- ----- the algorithms ----------------------------------------------------------------------
-- Each step returns: admits, remaining, reset, retry (-1 = never), write (a function or nil).

local function outcome_refused(remaining, reset, retry)
  return false, remaining, reset, retry, nil
end

-- ----- fixed windows ------------------------------------------------------------------------
-- One key per window, in one of two encodings, chosen when the window opens:
--   a counter  a string integer `used` whose absolute expiry is the window's end + margin
--              (SET PXAT): reset = PEXPIRETIME - margin. INCRBY counts into it, DECRBY
--              refunds. Redis expires it by its own clock, so it is opened only when the
--              caller's clock is within half the margin of Redis's (always under `clock:
--              redis`; one TIME per window opened tells): the key then outlives its window.
--   a hash     reset, used; PEXPIRE reset - now + margin (relative: it outlives its window
--              whatever the clocks say). Opened by a caller whose clock is further off.
-- Every path reads both (GET, and HMGET when the key holds a hash), so a window is counted in
-- one place whichever process opened it, and a script never touches another key for it.
-- Redis Cluster's MIGRATE moves a counter with a relative TTL: its end moves by the offset
-- between the two nodes' clocks (and the time in flight), once per migration; a hash's end is
-- its `reset`, which moves with nothing (docs/redis.md, "Time and expiry").

-- Now in ms: ARGV[1], or Redis TIME when it says "redis".
local function now_of(arg)
  if arg == 'redis' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  end
  return tonumber(arg)
end

-- Whether a window opened now may live in a counter, whose absolute expiry (reset + margin)
-- Redis reads on its own clock: only when the caller's clock is within half the margin of
-- Redis's (always under `clock: redis`, with a margin above 0).
local function counter_fits(now, margin, redis_clock)
  if redis_clock then
    return margin > 0
  end
  local skew = now_of('redis') - now
  return 2 * skew < margin and -2 * skew < margin
end

-- The end of a fixed window opened at `now`: `now + per`, or the next multiple of `per` when
-- aligned.
local function window_end(now, per, aligned)
  if aligned then
    return idiv(now, per) * per + per
  end
  return now + per
end

-- Writes into `key` a window ending at `r` that holds `used`: a counter when the caller's clock
-- fits, else a hash. `held` is the encoding the key holds now ('c', 'h' or nil): SET replaces
-- a hash, a counter is deleted before a hash is written. Returns the encoding written.
local function fw_write(key, r, used, now, margin, redis_clock, held)
  if counter_fits(now, margin, redis_clock) then
    redis.call('SET', key, used, 'PXAT', r + margin)
    return 'c'
  end
  if held == 'c' then
    redis.call('DEL', key)
  end
  redis.call('HSET', key, 'reset', r, 'used', used)
  redis.call('PEXPIRE', key, r - now + margin)
  return 'h'
end

-- The window in `key`: used, reset and its encoding ('c', 'h'); nil when there is none.
-- A counter without expiry (PERSIST, `RESTORE key 0`, a tool's SET), or whose end lies further
-- than `per` + margin ahead (a restore with a wrong TTL), has lost its window's end: it is
-- re-armed, its count kept and its end where a window opened now would end (`write`: written
-- back; a read-only call reports it so). It never admits more than `max` over the count it
-- kept, and recovers by itself.
local function fw_read(key, now, per, aligned, margin, write, redis_clock)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    -- Not a string: a hash window (any other type fails HMGET with WRONGTYPE).
    local h = redis.call('HMGET', key, 'reset', 'used')
    local reset, used = int_field(key, 'reset', h[1]), int_field(key, 'used', h[2])
    if reset == nil or used == nil then
      corrupt(key, 'a fixed window needs both reset and used')
    end
    return used, reset, 'h'
  end
  if not v then
    return nil
  end
  local used = as_int(v)
  if used == nil then
    corrupt(key, 'a fixed-window counter holds ' .. tostring(v) .. ', not an integer')
  end
  local e = redis.call('PEXPIRETIME', key)
  if e >= 0 and e - margin <= now + per + margin then
    return used, e - margin, 'c'
  end
  local r = window_end(now, per, aligned)
  if write then
    return used, r, fw_write(key, r, used, now, margin, redis_clock, 'c')
  end
  return used, r, 'c'
end

local function fixed_window(key, l, cost, now, margin)
  local used, reset, enc = fw_read(key, now, l.per, l.aligned, margin, l.write, l.redis_clock)
  local open = enc ~= nil and now < reset
  if not open then
    used = 0
  end
  local max, per = l.max, l.per
  local remaining = max - used
  if remaining < 0 then
    remaining = 0
  end
  local r
  if open then
    r = reset
  elseif l.aligned then
    r = window_end(now, per, true)
  else
    r = now
  end
  if cost > max then
    return outcome_refused(remaining, r, -1)
  end
  if cost > remaining then
    return outcome_refused(remaining, r, r - now)
  end
  if cost == 0 then
    return true, remaining, r, 0, nil
  end
  if open then
    return true, remaining - cost, r, 0, function()
      if enc == 'c' then
        redis.call('INCRBY', key, cost)
      else
        redis.call('HINCRBY', key, 'used', cost)
      end
    end
  end
  local new_reset = window_end(now, per, l.aligned)
  return true, remaining - cost, new_reset, 0, function()
    fw_write(key, new_reset, cost, now, margin, l.redis_clock, enc)
  end
end

-- The counted buckets of a sliding window, oldest first, and the stale fields.
local function sliding_buckets(key, l, now)
  local h = redis.call('HGETALL', key)
  local p, per = l.precision, l.per
  local current = now - (now - idiv(now, p) * p)
  local lowest = current + p - per
  if lowest < 0 then
    lowest = 0
  end
  local counted, stale = {}, {}
  for i = 1, #h, 2 do
    local start = int_field(key, 'bucket', h[i])
    local n = int_field(key, 'bucket ' .. h[i], h[i + 1])
    if start >= lowest then
      counted[#counted + 1] = {start, n}
    else
      stale[#stale + 1] = h[i]
    end
  end
  table.sort(counted, function(a, b) return a[1] < b[1] end)
  return counted, stale, current
end

local function sliding_window(key, l, cost, now, margin)
  local counted, stale, current = sliding_buckets(key, l, now)
  local max, per = l.max, l.per
  local used = 0
  for i = 1, #counted do
    used = used + counted[i][2]
  end
  local remaining = max - used
  if remaining < 0 then
    remaining = 0
  end
  local r = now
  if #counted > 0 then
    r = counted[1][1] + per
  end
  if cost > max then
    return outcome_refused(remaining, r, -1)
  end
  if cost > remaining then
    local left = used
    for i = 1, #counted do
      left = left - counted[i][2]
      if cost <= max - left then
        return outcome_refused(remaining, r, counted[i][1] + per - now)
      end
    end
    return outcome_refused(remaining, r, -1) -- unreachable: cost <= max
  end
  if cost == 0 then
    return true, remaining, r, 0, nil
  end
  local oldest = current
  if #counted > 0 and counted[1][1] < current then
    oldest = counted[1][1]
  end
  local newest = current
  if #counted > 0 and counted[#counted][1] > current then
    newest = counted[#counted][1]
  end
  return true, remaining - cost, oldest + per, 0, function()
    redis.call('HINCRBY', key, fmt(current), fmt(cost))
    if #stale > 0 then
      call_chunked('HDEL', key, stale)
    end
    redis.call('PEXPIRE', key, fmt(newest + per - now + margin))
  end
end

-- How far the stored TAT lies beyond now, as a pair (ms, frac).
local function bucket_ahead(key, l, now)
  local v = redis.call('HMGET', key, 'tat', 'frac')
  local tat, frac = int_field(key, 'tat', v[1]), int_field(key, 'frac', v[2])
  if (tat == nil) ~= (frac == nil) then
    corrupt(key, 'a token bucket needs both tat and frac')
  end
  if tat ~= nil and frac >= l.max then
    corrupt(key, 'frac ' .. fmt(frac) .. ' is not below max')
  end
  if tat ~= nil and (tat > now or (tat == now and frac > 0)) then
    return tat - now, frac
  end
  return 0, 0
end

local function bucket_remaining(l, ams, af)
  if pair_gt(ams, af, l.tau_ms, l.tau_frac) then
    return 0
  end
  local dms, df = pair_sub(l.tau_ms, l.tau_frac, ams, af, l.max)
  return muladd_div(dms, l.max, df, l.per)
end

local function ceil_ms(ms, f)
  if f > 0 then
    return ms + 1
  end
  return ms
end

local function token_bucket(key, l, cost, now, margin)
  local ams, af = bucket_ahead(key, l, now)
  local remaining = bucket_remaining(l, ams, af)
  local reset = now + ceil_ms(ams, af)
  if cost > l.max or cost > l.burst then
    return outcome_refused(remaining, reset, -1)
  end
  -- The step in ARGV is for the request's cost; a cost of 0 (a report) steps by nothing.
  local sms, sf = l.step_ms, l.step_frac
  if cost == 0 then
    sms, sf = 0, 0
  end
  local nms, nf = pair_add(ams, af, sms, sf, l.max)
  if pair_gt(nms, nf, l.tau_ms, l.tau_frac) then
    local wms, wf = pair_sub(nms, nf, l.tau_ms, l.tau_frac, l.max)
    return outcome_refused(remaining, reset, ceil_ms(wms, wf))
  end
  if cost == 0 then
    return true, remaining, reset, 0, nil
  end
  local new_reset = now + ceil_ms(nms, nf)
  return true, bucket_remaining(l, nms, nf), new_reset, 0, function()
    redis.call('HSET', key, 'tat', fmt(now + nms), 'frac', fmt(nf))
    redis.call('PEXPIRE', key, fmt(new_reset - now + margin))
  end
end

-- A concurrency limit's leases: a sorted set (its key: member lease id, score expiry) and the
-- units hash `l.units` (lease id -> cost, and `used`, the total cost of every lease in the
-- set, lapsed or not). Returns the units of the live leases, leaving out `except` (a lease
-- being taken again), the leases that lapsed ({id, cost}: deleted by the next write), the
-- excepted lease's cost when it is live, and the stored total.
local function cc_read(key, l, now, except)
  local total = int_field(l.units, 'used', redis.call('HGET', l.units, 'used')) or 0
  local used, gone = total, {}
  local lapsed = redis.call('ZRANGEBYSCORE', key, '-inf', fmt(now))
  if #lapsed > 0 then
    local costs = call_chunked('HMGET', l.units, lapsed)
    for i = 1, #lapsed do
      local c = int_field(l.units, 'lease ' .. lapsed[i], costs[i])
      if c == nil then
        corrupt(l.units, 'lease ' .. lapsed[i] .. ' has no cost')
      end
      used = used - c
      gone[#gone + 1] = {lapsed[i], c}
    end
  end
  local own = nil
  if except ~= nil then
    local e = redis.call('ZSCORE', key, except)
    if e and tonumber(e) > now then
      own = int_field(l.units, 'lease ' .. except, redis.call('HGET', l.units, except))
      if own == nil then
        corrupt(l.units, 'lease ' .. except .. ' has no cost')
      end
      used = used - own
    end
  end
  if used < 0 then
    corrupt(l.units, 'used ' .. fmt(total) .. ' is less than the leases it counts')
  end
  return used, gone, own, total
end

-- When the last live lease other than `except` lapses (`now` when none is held).
local function cc_reset(key, now, except)
  local top = redis.call('ZREVRANGE', key, 0, 1, 'WITHSCORES')
  for j = 1, #top, 2 do
    if top[j] ~= except then
      local e = tonumber(top[j + 1])
      if e > now then
        return e
      end
      return now
    end
  end
  return now
end

-- Deletes the lapsed leases `gone` (and `also`, a lease id, when given).
local function cc_drop(key, l, gone, also)
  local ids = {}
  for i = 1, #gone do
    ids[#ids + 1] = gone[i][1]
  end
  if also ~= nil then
    ids[#ids + 1] = also
  end
  if #ids > 0 then
    call_chunked('ZREM', key, ids)
    call_chunked('HDEL', l.units, ids)
  end
end

-- `l.lease` is set for `hold` only: an admitted cost above zero is then held under that id,
-- replacing a lease of the same id (whose own units do not count against it).
local function concurrency(key, l, cost, now, margin)
  local lease = nil
  if cost > 0 then
    lease = l.lease
  end
  local used, gone = cc_read(key, l, now, lease)
  local reset = cc_reset(key, now, lease)
  local max = l.max
  local remaining = max - used
  if remaining < 0 then
    remaining = 0
  end
  if cost > max then
    return outcome_refused(remaining, reset, -1)
  end
  if cost > remaining then
    -- Leases lapse in order of expiry: the first instant at which what is left admits.
    local left, offset = used, 0
    while true do
      local batch = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now), '+inf', 'WITHSCORES',
        'LIMIT', offset, 16)
      if #batch == 0 then
        return outcome_refused(remaining, reset, -1) -- unreachable: cost <= max
      end
      offset = offset + 16
      for j = 1, #batch, 2 do
        if batch[j] ~= lease then
          local c = int_field(l.units, 'lease ' .. batch[j], redis.call('HGET', l.units, batch[j]))
          if c == nil then
            corrupt(l.units, 'lease ' .. batch[j] .. ' has no cost')
          end
          left = left - c
          if left + cost <= max then
            return outcome_refused(remaining, reset, tonumber(batch[j + 1]) - now)
          end
        end
      end
    end
  end
  if lease == nil then
    return true, remaining, reset, 0, nil
  end
  local expires = now + l.per
  local new_reset = reset
  if expires > new_reset then
    new_reset = expires
  end
  return true, remaining - cost, new_reset, 0, function()
    cc_drop(key, l, gone, nil)
    redis.call('ZADD', key, fmt(expires), lease)
    redis.call('HSET', l.units, lease, fmt(cost), 'used', fmt(used + cost))
    local ttl = fmt(new_reset - now + margin)
    redis.call('PEXPIRE', key, ttl)
    redis.call('PEXPIRE', l.units, ttl)
  end
end

local STEP = {fixed_window, fixed_window, sliding_window, token_bucket, concurrency}

-- ----- refunds -----------------------------------------------------------------------------

local function refund_fixed(key, l, cost, now, margin)
  local used, reset, enc = fw_read(key, now, l.per, l.aligned, margin, true, l.redis_clock)
  if enc and now < reset and used > 0 then
    local back = cost
    if back > used then
      back = used
    end
    if enc == 'c' then
      redis.call('DECRBY', key, back)
    else
      redis.call('HINCRBY', key, 'used', -back)
    end
  end
end

local function refund_sliding(key, l, cost, now, margin)
  local counted, stale = sliding_buckets(key, l, now)
  if #counted == 0 then
    return
  end
  local left = cost
  for i = #counted, 1, -1 do
    if left == 0 then
      break
    end
    local b = counted[i]
    local take = b[2]
    if left < take then
      take = left
    end
    left = left - take
    if b[2] - take == 0 then
      stale[#stale + 1] = fmt(b[1])
    else
      redis.call('HSET', key, fmt(b[1]), fmt(b[2] - take))
    end
  end
  if #stale > 0 then
    call_chunked('HDEL', key, stale)
  end
end

local function refund_bucket(key, l, cost, now, margin)
  local ams, af = bucket_ahead(key, l, now)
  if ams == 0 and af == 0 then
    return
  end
  local rms, rf = 0, 0
  if pair_gt(ams, af, l.step_ms, l.step_frac) then
    rms, rf = pair_sub(ams, af, l.step_ms, l.step_frac, l.max)
  end
  redis.call('HSET', key, 'tat', fmt(now + rms), 'frac', fmt(rf))
end

-- A refund is not a release: it leaves leases as they are.
local function refund_none()
end

local REFUND = {refund_fixed, refund_fixed, refund_sliding, refund_bucket, refund_none}

-- ----- the policy --------------------------------------------------------------------------

-- The arguments each operation adds after the limits', and the keys after the limits' own.
local EXTRA_ARGS = {check = 0, peek = 0, refund = 0, acquire = 3, hold = 1, release = 1}
local EXTRA_KEYS = {check = 0, peek = 0, refund = 0, acquire = 1, hold = 0, release = 0}

local function parse(op, keys, args)
  local now = now_of(args[1])
  local cost, margin, n = tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
  if now == nil or cost == nil or margin == nil or n == nil or n < 1
    or #args ~= 4 + 9 * n + EXTRA_ARGS[op] then
    error('SLUICE_ARGS expected now, cost, margin, n and 9 values per limit for ' .. #keys .. ' keys', 0)
  end
  local limits = {}
  for i = 1, n do
    local o = 4 + 9 * (i - 1)
    local alg = tonumber(args[o + 1])
    limits[i] = {
      alg = alg, aligned = alg == 2,
      max = tonumber(args[o + 2]), per = tonumber(args[o + 3]),
      precision = tonumber(args[o + 4]), burst = tonumber(args[o + 5]),
      tau_ms = tonumber(args[o + 6]), tau_frac = tonumber(args[o + 7]),
      step_ms = tonumber(args[o + 8]), step_frac = tonumber(args[o + 9]),
      write = op ~= 'peek', redis_clock = args[1] == 'redis',
    }
    if STEP[alg] == nil then
      error('SLUICE_ARGS unknown algorithm ' .. tostring(args[o + 1]), 0)
    end
  end
  -- A concurrency limit's units hash is the last key.
  local units = 0
  for i = 1, n do
    if limits[i].alg == 5 then
      units = 1
      limits[i].units = keys[#keys]
    end
  end
  if #keys ~= n + EXTRA_KEYS[op] + units then
    error('SLUICE_ARGS expected ' .. (n + EXTRA_KEYS[op] + units) .. ' keys for ' .. n ..
      ' limits, got ' .. #keys, 0)
  end
  return now, cost, margin, limits
end

-- Decides `cost` over every limit; with `record`, writes only if every limit admits.
local function decide(keys, now, cost, margin, limits, record)
  local n = #limits
  local admits, remaining, reset, retry, writes = {}, {}, {}, {}, {}
  local allowed = true
  for i = 1, n do
    -- `skip`: a limit not charged (the other limits of a renewed lease).
    local c = cost
    if limits[i].skip then
      c = 0
    end
    admits[i], remaining[i], reset[i], retry[i], writes[i] =
      STEP[limits[i].alg](keys[i], limits[i], c, now, margin)
    allowed = allowed and admits[i]
  end
  if not allowed and cost > 0 then
    -- Nothing is recorded: limits that would admit report their state without the cost.
    for i = 1, n do
      if admits[i] then
        admits[i], remaining[i], reset[i], retry[i] =
          STEP[limits[i].alg](keys[i], limits[i], 0, now, margin)
      end
    end
  end
  if allowed and record then
    for i = 1, n do
      if writes[i] then
        writes[i]()
      end
    end
  end
  local reply = {allowed and 1 or 0, now}
  for i = 1, n do
    reply[#reply + 1] = admits[i] and 1 or 0
    reply[#reply + 1] = remaining[i]
    reply[#reply + 1] = reset[i]
    reply[#reply + 1] = retry[i]
  end
  return reply
end

-- The bucket step of `g` units from the step of one: g times (ms, frac), by doubling, so every
-- intermediate stays exact (each partial step is at most the step of g <= burst).
local function scale_step(l, g)
  local rms, rf = 0, 0
  local pms, pf = l.step_ms, l.step_frac
  while g > 0 do
    local half = floor(g / 2)
    if g - half * 2 == 1 then
      rms, rf = pair_add(rms, rf, pms, pf, l.max)
    end
    g = half
    if g > 0 then
      pms, pf = pair_add(pms, pf, pms, pf, l.max)
    end
  end
  return rms, rf
end

-- Takes the most every limit admits now, between `cost` and the batch in the last ARGV
-- (evaluate.rs `acquire`): each limit's remaining at cost 0 is exactly the most it admits.
local function acquire(keys, args, now, cost, margin, limits)
  local grant = tonumber(args[5 + 9 * #limits])
  if grant == nil then
    error('SLUICE_ARGS acquire needs the most units to take', 0)
  end
  for i = 1, #limits do
    local l = limits[i]
    local _, remaining = STEP[l.alg](keys[i], l, 0, now, margin)
    if remaining < grant then
      grant = remaining
    end
    if l.max < grant then
      grant = l.max
    end
  end
  local take = cost
  if grant >= cost and grant > 0 then
    take = grant
  end
  for i = 1, #limits do
    if limits[i].alg == 4 then
      limits[i].step_ms, limits[i].step_frac = scale_step(limits[i], take)
    end
  end
  local reply = decide(keys, now, take, margin, limits, true)
  reply[#reply + 1] = take
  -- The holders: this one counts until now + ttl; those past their time are dropped.
  local holder, ttl, hk = args[6 + 9 * #limits], tonumber(args[7 + 9 * #limits]), keys[#limits + 1]
  local holders = 0
  if holder ~= '0' then
    if ttl == nil or ttl < 1 then
      error('SLUICE_ARGS acquire needs how long a holder counts', 0)
    end
    redis.call('ZADD', hk, fmt(now + ttl), holder)
    redis.call('ZREMRANGEBYSCORE', hk, '-inf', fmt(now))
    redis.call('PEXPIRE', hk, fmt(ttl + margin))
    holders = redis.call('ZCARD', hk)
  end
  reply[#reply + 1] = holders
  return reply
end

-- ----- rate policies: the lean path -----------------------------------------------------------
-- A check or peek of a policy whose limits are fixed windows, sliding windows and token buckets
-- (any mix): the calls that make up nearly all the traffic. The Rust caller has validated
-- every argument (the policy is valid by construction), so nothing here re-checks them; only
-- the stored state is checked, before anything is written. The script decides and writes; it
-- returns each limit's state as it was read, and the caller computes every reported number
-- (remaining, reset, retry_after, the binding limit) with `sluice_core::evaluate` itself, the
-- very function the memory store runs. One pass, no table per limit, numbers passed to Redis
-- as they are.
--
-- Lean layout (functions __LIB___rate and __LIB___rate_ro):
--   KEYS[i]  limit i's state, in the policy's order (a fixed window's: see "fixed windows")
--   ARGV[1]  now in ms, or "redis"; ARGV[2] cost; ARGV[3] expiry margin in ms;
--   then per limit, by algorithm:
--     1 max per          fixed window (2: aligned): a window opens as a counter, or as a hash
--                        when the caller's clock is off Redis's by half the margin or more
--                        (`counter_fits`)
--     3 max per prec     sliding window
--     4 max per burst tau_ms tau_frac step_ms step_frac
--                        token bucket; the step is `cost·per/max` (in a batch: of one unit)
-- Reply: { allowed (0/1), now, then per limit the state read }:
--   fixed window    reset, used          (0, 0: none)
--   sliding window  k, then k pairs      (the counted buckets, start and units, any order)
--   token bucket    tat, frac            (0, 0: none)
-- Writes, when every limit admits a cost above zero and the call records (a check):
--   fixed window    inside an open window only `used` (INCRBY of the counter, HINCRBY of
--                   the hash): the expiry set when it opened still covers it; a new window:
--                   SET counter cost PXAT end + margin, or HSET reset and used + PEXPIRE
--                   end - now + margin. A check of cost 1..max of a policy of fixed windows
--                   only takes `fw_fast` (one) or `fw_fast_n` (several): INCRBY, then
--                   PEXPIRETIME (DECRBY when refused; undone and left to the full path when
--                   the key holds a hash or a counter to re-arm).
--   sliding window  HINCRBY of the current bucket; PEXPIRE only when that bucket is new (an
--                   existing one was given its expiry when it was made); HDEL of stale buckets
--   token bucket    HSET tat and frac, PEXPIRE the new TAT + margin
-- A check of cost 1..max (a bucket: 1..min(max, burst)) of a policy of one token bucket or
-- one sliding window takes `tb_fast` or `sw_fast`: the same commands, reads and writes as the
-- full path, without its tables and second pass.

-- An integer read from stored state: a number, whole, 0 to 2^53; anything else is corrupt.
local function stored(key, name, v)
  local n = as_int(v)
  if n == nil then
    corrupt(key, 'field ' .. name .. ' holds ' .. tostring(v) .. ', not an integer')
  end
  return n
end

-- Whether a counter's end `reset`, read at `now`, belongs to a window that is open and whose
-- end is where a window of `per` can end (not a counter to re-arm: `fw_read`).
local function counter_open(reset, now, per, margin)
  return now < reset and reset <= now + per + margin
end

-- The fast path of a check of cost 1..max on a policy of one fixed window: INCRBY first, then
-- the counter's expiry tells whether its window is open (2 commands; a refusal takes its count
-- back with DECRBY). A counter INCRBY just made, or whose window has closed, opens a new window
-- (its expiry set as `rate` would set it) when the caller's clock fits. Anything else (a hash
-- window, a counter to re-arm, a caller's clock too far off Redis's) is undone and left to
-- `rate`: returns nil. The reply is `rate`'s: the state as read.
local function fw_fast(key, max, per, aligned, now, cost, margin, redis_clock)
  local u = redis.pcall('INCRBY', key, cost)
  if type(u) ~= 'number' then
    if string.sub(tostring(u.err), 1, 9) == 'WRONGTYPE' then
      return nil -- a hash window (or corrupt state `rate` names): nothing was written
    end
    corrupt(key, 'a fixed-window counter is not an integer (' .. tostring(u.err) .. ')')
  end
  local used = u - cost
  if used < 0 then
    redis.call('DECRBY', key, cost)
    corrupt(key, 'a fixed-window counter holds ' .. used)
  end
  local e = redis.call('PEXPIRETIME', key)
  local reset = e - margin
  if e >= 0 and counter_open(reset, now, per, margin) then
    if u <= max then
      return {1, now, reset, used}
    end
    redis.call('DECRBY', key, cost)
    return {0, now, reset, used}
  end
  if (used == 0 and e == -1) or (e >= 0 and reset <= now) then
    if counter_fits(now, margin, redis_clock) then
      redis.call('SET', key, cost, 'PXAT', window_end(now, per, aligned) + margin)
      if e < 0 then
        return {1, now, 0, 0}
      end
      return {1, now, reset, used}
    end
  end
  if used == 0 and e == -1 then
    redis.call('DEL', key)
  else
    redis.call('DECRBY', key, cost)
  end
  return nil
end

-- Takes back the optimistic INCRBYs of the first `m` counters from KEYS[k] (`made[i]`: the
-- INCRBY created the counter, which is then deleted).
local function fw_undo(keys, k, m, cost, made)
  for i = 0, m - 1 do
    if made[i] then
      redis.call('DEL', keys[k + i])
    else
      redis.call('DECRBY', keys[k + i], cost)
    end
  end
end

-- `fw_fast` for a policy of n >= 2 limits, every one a fixed window (values from ARGV[a], 3
-- per limit): INCRBY + PEXPIRETIME per limit, then, if any refuses, every count is taken
-- back; windows that open are given their expiry (SET PXAT) once all admit. Nothing else is
-- written before a failure is raised, so a failed decision wrote nothing. Returns nil
-- (everything undone) where `rate` must decide.
local function fw_fast_n(keys, k, n, args, a, now, cost, margin, redis_clock)
  local out, made, fresh = {1, now}, {}, nil
  local allowed, fits = true, nil
  for i = 0, n - 1 do
    local key, o = keys[k + i], a + 3 * i
    local max, per = tonumber(args[o + 1]), tonumber(args[o + 2])
    if cost > max then
      fw_undo(keys, k, i, cost, made)
      return nil
    end
    local u = redis.pcall('INCRBY', key, cost)
    if type(u) ~= 'number' then
      fw_undo(keys, k, i, cost, made)
      if string.sub(tostring(u.err), 1, 9) == 'WRONGTYPE' then
        return nil
      end
      corrupt(key, 'a fixed-window counter is not an integer (' .. tostring(u.err) .. ')')
    end
    local used = u - cost
    local e = redis.call('PEXPIRETIME', key)
    local reset = e - margin
    made[i] = used == 0 and e == -1
    if used < 0 then
      fw_undo(keys, k, i + 1, cost, made)
      corrupt(key, 'a fixed-window counter holds ' .. used)
    end
    if e >= 0 and counter_open(reset, now, per, margin) then
      out[3 + 2 * i], out[4 + 2 * i] = reset, used
      if u > max then
        allowed = false
      end
    else
      if fits == nil then
        fits = counter_fits(now, margin, redis_clock)
      end
      if not (fits and (made[i] or (e >= 0 and reset <= now))) then
        fw_undo(keys, k, i + 1, cost, made)
        return nil
      end
      fresh = fresh or {}
      fresh[i] = window_end(now, per, args[o] == '2')
      if made[i] then
        out[3 + 2 * i], out[4 + 2 * i] = 0, 0
      else
        out[3 + 2 * i], out[4 + 2 * i] = reset, used
      end
    end
  end
  if not allowed then
    fw_undo(keys, k, n, cost, made)
    out[1] = 0
  elseif fresh then
    for i, r in pairs(fresh) do
      redis.call('SET', keys[k + i], cost, 'PXAT', r + margin)
    end
  end
  return out
end

-- Whether the `n` limits whose values start at ARGV[a] are all fixed windows.
local function all_fixed(args, a, n)
  for i = 0, n - 1 do
    local alg = args[a + 3 * i]
    if alg ~= '1' and alg ~= '2' then
      return false
    end
  end
  return true
end

-- A bucket's units as stored: `stored`, naming the bucket only when it is corrupt.
local function bucket_units(key, start, v)
  local n = as_int(v)
  if n == nil then
    stored(key, 'bucket ' .. start, v)
  end
  return n
end

-- A token bucket's stored state, checked before anything is written: tat and frac as read
-- (0, 0: none), and how far the TAT lies beyond now as a pair (ms, frac).
local function tb_read(key, max, now)
  local v = redis.call('HMGET', key, 'tat', 'frac')
  local tat, frac = v[1], v[2]
  if not tat then
    if frac then
      corrupt(key, 'a token bucket needs both tat and frac')
    end
    return 0, 0, 0, 0
  end
  if not frac then
    corrupt(key, 'a token bucket needs both tat and frac')
  end
  tat, frac = stored(key, 'tat', tat), stored(key, 'frac', frac)
  if frac >= max then
    corrupt(key, 'frac ' .. frac .. ' is not below max')
  end
  if tat > now or (tat == now and frac > 0) then
    return tat, frac, tat - now, frac
  end
  return tat, frac, 0, 0
end

-- A sliding window's buckets, checked before anything is written: appends the count k and the
-- k counted buckets (start, units) to `out`; returns the units they hold, the current bucket's
-- start, the newest start (at least the current one) and the stale fields (nil: none).
local function sw_read(key, per, p, now, out)
  local h = redis.call('HGETALL', key)
  local current = now - now % p
  local lowest = current + p - per
  local used, newest, count, stale = 0, current, #out + 1, nil
  out[count] = 0
  for j = 1, #h, 2 do
    local start = stored(key, 'bucket', h[j])
    local c = bucket_units(key, h[j], h[j + 1])
    if start >= lowest then
      used = used + c
      if start > newest then
        newest = start
      end
      out[#out + 1], out[#out + 2] = start, c
    else
      stale = stale or {}
      stale[#stale + 1] = h[j]
    end
  end
  out[count] = (#out - count) / 2
  return used, current, newest, stale
end

-- A token bucket's values from ARGV[a] (its algorithm's) as numbers: max, tau (ms, frac) and
-- step (ms, frac); a sliding window's: max, per, precision. A batch reads them once.
local function tb_values(args, a)
  return tonumber(args[a + 1]), tonumber(args[a + 4]), tonumber(args[a + 5]),
    tonumber(args[a + 6]), tonumber(args[a + 7])
end
local function sw_values(args, a)
  return tonumber(args[a + 1]), tonumber(args[a + 2]), tonumber(args[a + 3])
end

-- The fast path of a check of cost 1..min(max, burst) on a policy of one token bucket (max,
-- tau and step as `tb_values` reads them): HMGET, then HSET + PEXPIRE when it admits, with
-- the checks of stored state `rate` makes and no table but the reply. With `unit`, the step
-- is that of one unit (a batch) and is scaled to the cost here.
local function tb_fast(key, max, tms, tf, sms, sf, now, cost, margin, unit)
  local tat, frac, ams, af = tb_read(key, max, now)
  if unit and cost > 1 then
    sms, sf = scale_step({step_ms = sms, step_frac = sf, max = max}, cost)
  end
  local nms, nf = pair_add(ams, af, sms, sf, max)
  if pair_gt(nms, nf, tms, tf) then
    return {0, now, tat, frac}
  end
  local ttl = nms + margin
  if nf > 0 then
    ttl = ttl + 1
  end
  redis.call('HSET', key, 'tat', now + nms, 'frac', nf)
  redis.call('PEXPIRE', key, ttl)
  return {1, now, tat, frac}
end

-- The fast path of a check of cost 1..max on a policy of one sliding window (max, per and
-- precision as `sw_values` reads them): HGETALL, then HINCRBY of the current bucket when it
-- admits (PEXPIRE when that bucket is new, HDEL of stale buckets), as `rate` decides and
-- writes it, with no table but the reply and the stale fields.
local function sw_fast(key, max, per, p, now, cost, margin)
  local out = {1, now}
  local used, current, newest, stale = sw_read(key, per, p, now, out)
  if used + cost > max then
    out[1] = 0
    return out
  end
  if redis.call('HINCRBY', key, current, cost) == cost then
    redis.call('PEXPIRE', key, newest + per - now + margin)
  end
  if stale then
    call_chunked('HDEL', key, stale)
  end
  return out
end

-- Decides `cost` for the policy whose keys start at KEYS[k] and whose limits' values start at
-- ARGV[a]; `n` limits. With `unit`, a bucket's step in ARGV is that of one unit and is scaled
-- to the cost here. Appends the reply to `out` (from `out[o]`) and returns it.
local function rate(keys, k, args, a, n, now, cost, margin, record, unit, redis_clock)
  local out = {1, now}
  local allowed = true
  -- Pass 1: read and judge every limit; remember what a write would need.
  local w = {}
  local o = a
  for i = 0, n - 1 do
    local key, alg, max, per = keys[k + i], args[o], tonumber(args[o + 1]), tonumber(args[o + 2])
    if alg == '1' or alg == '2' then
      local aligned = alg == '2'
      local used, reset, enc = fw_read(key, now, per, aligned, margin, record, redis_clock)
      if enc then
        out[#out + 1], out[#out + 2] = reset, used
      else
        out[#out + 1], out[#out + 2] = 0, 0
      end
      if cost > max then
        allowed = false
      elseif enc and now < reset then
        if cost > 0 and used + cost > max then
          allowed = false
        end
        w[i + 1] = enc -- open: add to used where it is
      else
        w[i + 1] = {window_end(now, per, aligned), enc} -- a new window ending there
      end
      o = o + 3
    elseif alg == '3' then
      local used, current, newest, stale = sw_read(key, per, tonumber(args[o + 3]), now, out)
      if cost > max or (cost > 0 and used + cost > max) then
        allowed = false
      end
      w[i + 1] = {current, newest + per, stale}
      o = o + 4
    else
      local burst = tonumber(args[o + 3])
      local tat, frac, ams, af = tb_read(key, max, now)
      out[#out + 1], out[#out + 2] = tat, frac
      if cost > max or cost > burst then
        allowed = false
      else
        local sms, sf = 0, 0
        if cost > 0 then
          sms, sf = tonumber(args[o + 6]), tonumber(args[o + 7])
          if unit and cost > 1 then
            sms, sf = scale_step({step_ms = sms, step_frac = sf, max = max}, cost)
          end
        end
        local nms, nf = pair_add(ams, af, sms, sf, max)
        if pair_gt(nms, nf, tonumber(args[o + 4]), tonumber(args[o + 5])) then
          allowed = false
        end
        w[i + 1] = {nms, nf}
      end
      o = o + 8
    end
  end
  -- Pass 2: record the cost in every limit, only if all admit.
  if allowed and record and cost > 0 then
    o = a
    for i = 0, n - 1 do
      local key, alg, x = keys[k + i], args[o], w[i + 1]
      if alg == '1' or alg == '2' then
        if x == 'c' then
          redis.call('INCRBY', key, cost)
        elseif x == 'h' then
          redis.call('HINCRBY', key, 'used', cost)
        else
          fw_write(key, x[1], cost, now, margin, redis_clock, x[2])
        end
        o = o + 3
      elseif alg == '3' then
        if redis.call('HINCRBY', key, x[1], cost) == cost then
          redis.call('PEXPIRE', key, x[2] - now + margin)
        end
        if x[3] then
          call_chunked('HDEL', key, x[3])
        end
        o = o + 4
      else
        local reset = now + x[1]
        if x[2] > 0 then
          reset = reset + 1
        end
        redis.call('HSET', key, 'tat', now + x[1], 'frac', x[2])
        redis.call('PEXPIRE', key, reset - now + margin)
        o = o + 8
      end
    end
  end
  if not allowed then
    out[1] = 0
  end
  return out
end

-- The number of ARGV values of the `n` limits whose values start at ARGV[a].
local function rate_width(args, a, n)
  local o = a
  for _ = 1, n do
    local alg = args[o]
    if alg == '3' then
      o = o + 4
    elseif alg == '4' then
      o = o + 8
    else
      o = o + 3
    end
  end
  return o - a
end

-- A single call on the lean layout.
local function rate_call(keys, args, record)
  local now, cost, margin = now_of(args[1]), tonumber(args[2]), tonumber(args[3])
  local alg = args[4]
  if record and #keys == 1 and (alg == '1' or alg == '2') and cost > 0
    and cost <= tonumber(args[5]) then
    local r = fw_fast(keys[1], tonumber(args[5]), tonumber(args[6]), alg == '2', now, cost,
      margin, args[1] == 'redis')
    if r then
      return r
    end
  end
  if record and #keys == 1 and cost > 0 and cost <= tonumber(args[5]) then
    if alg == '4' and cost <= tonumber(args[7]) then
      local max, tms, tf, sms, sf = tb_values(args, 4)
      return tb_fast(keys[1], max, tms, tf, sms, sf, now, cost, margin, false)
    elseif alg == '3' then
      local max, per, p = sw_values(args, 4)
      return sw_fast(keys[1], max, per, p, now, cost, margin)
    end
  end
  if record and #keys > 1 and cost > 0 and all_fixed(args, 4, #keys) then
    local r = fw_fast_n(keys, 1, #keys, args, 4, now, cost, margin, args[1] == 'redis')
    if r then
      return r
    end
  end
  return rate(keys, 1, args, 4, #keys, now, cost, margin, record, false, args[1] == 'redis')
end

-- ----- a batch: the concurrent decisions of one Redis (one slot) in one call ---------------------
-- Function __LIB___batch. Each decision is a check (1) or a peek (2) of a rate policy, decided
-- in turn exactly as a single call would, atomically and all or nothing over its policy's
-- limits; a policy's values are sent once per batch. A decision that fails (corrupt state, a
-- key of the wrong type) fails alone: it wrote nothing (every limit is read and checked before
-- any write), and its entry in the reply is that error.
--   KEYS     every decision's keys, in order (n per decision, n its policy's limits)
--   ARGV[1]  expiry margin in ms; ARGV[2] "app", or "redis" to read TIME once for the batch;
--   ARGV[3]  the number of policies P, then each policy: n, then its limits' values as in the
--            lean layout (a bucket's step is that of one unit);
--   then per decision: op (1 check, 2 peek), its policy (1..P), now (ms; unused under
--   "redis"), cost.
-- Reply: one entry per decision, the lean reply or an error.
local function batch(keys, args)
  local margin, redis_time = tonumber(args[1]), args[2] == 'redis'
  local policies, a = {}, 4
  for p = 1, tonumber(args[3]) do
    local n = tonumber(args[a])
    policies[p] = {a + 1, n}
    local alg = args[a + 1]
    if n == 1 and (alg == '1' or alg == '2') then
      -- One fixed window: its max, per and alignment, for `fw_fast`.
      policies[p][3], policies[p][4] = tonumber(args[a + 2]), tonumber(args[a + 3])
      policies[p][5] = alg == '2'
    elseif n > 1 and all_fixed(args, a + 1, n) then
      policies[p][6] = true -- every limit a fixed window: `fw_fast_n`
    elseif n == 1 and alg == '4' then
      -- One token bucket: `tb_fast` takes costs up to the smaller of max and burst.
      policies[p][7] = math.min(tonumber(args[a + 2]), tonumber(args[a + 4]))
      policies[p][9] = {tb_values(args, a + 1)}
    elseif n == 1 and alg == '3' then
      policies[p][8] = tonumber(args[a + 2]) -- one sliding window, up to max: `sw_fast`
      policies[p][9] = {sw_values(args, a + 1)}
    end
    a = a + 1 + rate_width(args, a + 1, n)
  end
  local now = nil
  if redis_time then
    now = now_of('redis')
  end
  local out, k = {}, 1
  for e = a, #args, 4 do
    local p = policies[tonumber(args[e + 1])]
    local at = now or tonumber(args[e + 2])
    local cost, record = tonumber(args[e + 3]), args[e] == '1'
    local ok, r = true, nil
    if p[3] and record and cost > 0 and cost <= p[3] then
      ok, r = pcall(fw_fast, keys[k], p[3], p[4], p[5], at, cost, margin, redis_time)
    elseif p[6] and record and cost > 0 then
      ok, r = pcall(fw_fast_n, keys, k, p[2], args, p[1], at, cost, margin, redis_time)
    elseif p[7] and record and cost > 0 and cost <= p[7] then
      local b = p[9]
      ok, r = pcall(tb_fast, keys[k], b[1], b[2], b[3], b[4], b[5], at, cost, margin, true)
    elseif p[8] and record and cost > 0 and cost <= p[8] then
      local w = p[9]
      ok, r = pcall(sw_fast, keys[k], w[1], w[2], w[3], at, cost, margin)
    end
    if ok and not r then
      ok, r = pcall(rate, keys, k, args, p[1], p[2], at, cost, margin, record, true, redis_time)
    end
    if ok then
      out[#out + 1] = r
    else
      if type(r) == 'table' then
        r = r.err
      end
      out[#out + 1] = {err = tostring(r)}
    end
    k = k + p[2]
  end
  return out
end

-- Frees the lease in the last ARGV (evaluate.rs `release`) and reports the state after it;
-- the reply ends with the units it held (0: not held).
local function release(keys, args, now, margin, limits)
  local lease = args[5 + 9 * #limits]
  local freed = 0
  for i = 1, #limits do
    local l = limits[i]
    if l.alg == 5 then
      local used, gone, own = cc_read(keys[i], l, now, lease)
      if own ~= nil then
        freed = own
        cc_drop(keys[i], l, gone, lease)
        if redis.call('ZCARD', keys[i]) == 0 then
          redis.call('DEL', l.units)
        else
          redis.call('HSET', l.units, 'used', fmt(used))
        end
      end
    end
  end
  local reply = decide(keys, now, 0, margin, limits, false)
  reply[#reply + 1] = freed
  return reply
end

local function run(op, keys, args)
  if op == 'rate' or op == 'rate_ro' then
    return rate_call(keys, args, op == 'rate')
  elseif op == 'batch' then
    return batch(keys, args)
  end
  local now, cost, margin, limits = parse(op, keys, args)
  if op == 'check' then
    return decide(keys, now, cost, margin, limits, true)
  elseif op == 'peek' then
    return decide(keys, now, cost, margin, limits, false)
  elseif op == 'acquire' then
    return acquire(keys, args, now, cost, margin, limits)
  elseif op == 'hold' or op == 'release' then
    local lease = args[5 + 9 * #limits]
    if lease == nil or not string.match(lease, '^%d+$') then
      error('SLUICE_ARGS ' .. op .. ' needs a lease id', 0)
    end
    if op == 'release' then
      return release(keys, args, now, margin, limits)
    end
    -- Taking again a lease still held renews it: the other limits counted its request when
    -- it was taken, so they are neither charged nor consulted now.
    local renewing = false
    for i = 1, #limits do
      limits[i].lease = lease
      if limits[i].alg == 5 and cost > 0 then
        local e = redis.call('ZSCORE', keys[i], lease)
        renewing = e ~= false and e ~= nil and tonumber(e) > now
      end
    end
    if renewing then
      for i = 1, #limits do
        limits[i].skip = limits[i].alg ~= 5
      end
    end
    return decide(keys, now, cost, margin, limits, true)
  end
  for i = 1, #limits do
    if cost > 0 then
      REFUND[limits[i].alg](keys[i], limits[i], cost, now, margin)
    end
  end
  local reply = decide(keys, now, 0, margin, limits, false)
  reply[1] = 1
  return reply
end
