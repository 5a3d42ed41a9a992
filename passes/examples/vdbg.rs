use ppcc_passes::schedule::insert_communication;
use ppcc_passes::schedule::zb_v_greedy;
use ppcc_passes::simulate::{simulate, CostTable};
fn main() {
    let p = 16;
    let m = 64;
    let costs = CostTable::uniform(2 * p, 0.43, 0.75, 0.27, 0.005);
    let cap: usize = std::env::args()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(38);
    for (fb, ff) in [(false, false), (true, false), (false, true), (true, true)] {
        let Some(s) = zb_v_greedy(p, m, &costs, cap, fb, ff) else {
            println!("none");
            continue;
        };
        let r = simulate(&insert_communication(&s), &costs).unwrap();
        println!(
            "fb {fb} ff {ff}: {:.3} (bound {:.3})",
            r.makespan,
            m as f64 * 2.0 * (0.43 + 0.75 + 0.27)
        );
        if fb || ff {
            continue;
        }
        for rank in [15usize, 14] {
            let ev = &r.events[rank];
            let txt: Vec<String> = ev
                .iter()
                .filter(|e| e.action.kind.is_compute() && e.start < 30.0)
                .map(|e| format!("{}@{:.1}", e.action, e.start))
                .collect();
            println!("{rank}: {}", txt.join(" "));
        }
    }
}
