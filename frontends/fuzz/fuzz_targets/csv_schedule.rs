//! Any text as a torch CSV schedule over a few layouts (read, validate, simulate): an error
//! or a schedule, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ppcc_passes::schedule::csv::from_csv;
use ppcc_passes::schedule::Layout;
use ppcc_passes::simulate::{simulate, CostTable};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for layout in [
        Layout::chain(2),
        Layout::Interleaved { ranks: 2, chunks: 2 },
        Layout::VShape { ranks: 2 },
    ] {
        if let Ok(s) = from_csv(text, layout) {
            let _ = simulate(&s, &CostTable::uniform(s.num_virtual_stages(), 1.0, 1.0, 1.0, 0.5));
        }
    }
});
