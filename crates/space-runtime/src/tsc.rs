//! The host's TSC frequency, which an emulated guest must be told.
//!
//! Under TCG the guest's `rdtsc` returns the host's time-stamp counter, so the guest's TSC runs
//! at the host's rate. The guest kernel calibrates that rate against the emulated PIT at boot,
//! and under emulation the calibration loop is stalled often enough that about half the boots
//! give up on the TSC and fall back to a clock with 10 ms resolution. Passing the rate on the
//! command line (`tsc_early_khz=`) skips the calibration; `tsc=reliable` keeps the watchdog from
//! distrusting the TSC when the emulator stalls. Under KVM neither is needed.

use std::time::{Duration, Instant};

/// How long each measurement window is. Two windows bound the error to a few parts per
/// million: plenty for a clock the guest later disciplines from the host's wall clock.
const WINDOW: Duration = Duration::from_millis(10);

fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rdtsc` has no preconditions on x86_64 (every 64-bit x86 CPU has it, and user
    // mode may run it unless the kernel set CR4.TSD, which Linux does not by default).
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Measures the host's TSC rate in kHz against the monotonic clock. Blocks for about 20 ms.
/// Returns `None` when the counter does not advance sensibly (no TSC, or not x86_64).
/// `SPACE_TSC_KHZ` overrides the measurement.
pub fn host_tsc_khz() -> Option<u64> {
    if let Some(v) = std::env::var("SPACE_TSC_KHZ")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        return Some(v);
    }
    let mut best: Option<u64> = None;
    for _ in 0..2 {
        let t0 = Instant::now();
        let c0 = rdtsc();
        while t0.elapsed() < WINDOW {
            std::hint::spin_loop();
        }
        let c1 = rdtsc();
        let elapsed = t0.elapsed();
        let ticks = c1.checked_sub(c0)?;
        let khz = (ticks as u128 * 1_000_000 / elapsed.as_nanos().max(1)) as u64;
        // A preempted window reads low (the clock ran while we were off the CPU the same as
        // the counter, so in fact both move together); take the larger of two windows to
        // shrug off a window that straddled a migration to another CPU.
        best = Some(best.map_or(khz, |b| b.max(khz)));
    }
    // Below 100 MHz or above 20 GHz is not a TSC we can trust.
    best.filter(|khz| (100_000..20_000_000).contains(khz))
}

/// The command-line parameters a TCG guest needs for a stable clock.
pub fn tcg_cmdline_extra(tsc_khz: Option<u64>) -> String {
    match tsc_khz {
        Some(khz) => format!("tsc=reliable tsc_early_khz={khz}"),
        None => "tsc=reliable".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_plausible_rate() {
        let khz = host_tsc_khz().expect("an x86_64 host has a usable TSC");
        assert!((100_000..20_000_000).contains(&khz), "{khz} kHz");
        // Two measurements agree to within a percent.
        let again = host_tsc_khz().unwrap();
        let diff = khz.abs_diff(again) as f64 / khz as f64;
        assert!(diff < 0.01, "{khz} vs {again}");
    }

    #[test]
    fn extra_parameters() {
        assert_eq!(
            tcg_cmdline_extra(Some(2_596_130)),
            "tsc=reliable tsc_early_khz=2596130"
        );
        assert_eq!(tcg_cmdline_extra(None), "tsc=reliable");
    }
}
