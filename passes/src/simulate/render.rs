//! Writers of a [`SimReport`]: a Chrome/Perfetto trace and an SVG timeline.

use std::fmt::Write;

use super::{Event, SimReport};
use crate::schedule::ActionKind;

fn short_name(e: &Event) -> String {
    let code = match e.action.kind {
        ActionKind::Forward => "F",
        ActionKind::BackwardInput => "B",
        ActionKind::BackwardWeight => "W",
        ActionKind::FullBackward => "BW",
        ActionKind::OptimizerStep => "OPT",
        k => k.code(),
    };
    format!("{code}{} s{}", e.action.micro_batch, e.action.stage)
}

/// Chrome trace-event JSON (`chrome://tracing`, ui.perfetto.dev): one complete event
/// (`ph: "X"`) per compute action, `pid` 0, `tid` = rank; one cost unit is written as 1 µs
/// (the trace format's time unit).
pub fn to_trace_json(report: &SimReport) -> String {
    trace_json(report, 1.0)
}

/// [`to_trace_json`] for a simulation in seconds: timestamps in microseconds, as the
/// trace format defines them.
pub fn to_trace_json_seconds(report: &SimReport) -> String {
    trace_json(report, 1e6)
}

fn trace_json(report: &SimReport, scale: f64) -> String {
    let mut out = String::from("{\"traceEvents\":[\n");
    let mut first = true;
    for rank in 0..report.events.len() {
        if !first {
            out.push_str(",\n");
        }
        first = false;
        let _ = write!(
            out,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{rank},\"args\":{{\"name\":\"rank {rank}\"}}}}"
        );
    }
    for e in report.events.iter().flatten() {
        if !e.action.kind.is_compute() {
            continue;
        }
        let _ = write!(
            out,
            ",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{},\"dur\":{},\"args\":{{\"stage\":{},\"micro_batch\":{},\"chunk\":{}}}}}",
            short_name(e),
            e.action.kind.describe(),
            e.rank,
            e.start * scale,
            (e.end - e.start) * scale,
            e.action.stage,
            e.action.micro_batch,
            e.action.chunk
        );
    }
    out.push_str("\n],\"displayTimeUnit\":\"ms\"}\n");
    out
}

fn colour(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::Forward => "#4e79a7",
        ActionKind::BackwardInput => "#f28e2b",
        ActionKind::BackwardWeight => "#59a14f",
        ActionKind::FullBackward => "#e15759",
        _ => "#9c755f",
    }
}

/// An SVG timeline: one lane per rank, one box per compute action coloured by kind and
/// labelled with its micro-batch, a time axis and a legend.
pub fn to_svg(report: &SimReport) -> String {
    svg(report, &fmt_num, "")
}

/// [`to_svg`] for a simulation in seconds (axis in s, ms or µs), with a title line.
pub fn to_svg_seconds(report: &SimReport, title: &str) -> String {
    let span = report.makespan;
    let (unit, mult) = if span >= 1.0 {
        ("s", 1.0)
    } else if span >= 1e-3 {
        ("ms", 1e3)
    } else {
        ("µs", 1e6)
    };
    let fmt = move |x: f64| {
        let v = x * mult;
        let digits = if v == 0.0 || v.abs() >= 100.0 {
            0
        } else if v.abs() >= 10.0 {
            1
        } else {
            2
        };
        format!("{v:.digits$} {unit}")
    };
    svg(report, &fmt, title)
}

fn svg(report: &SimReport, fmt_num: &dyn Fn(f64) -> String, title: &str) -> String {
    let lanes = report.events.len();
    let (left, top, lane_h, width) = (70.0, 40.0, 34.0, 1000.0);
    let span = if report.makespan > 0.0 {
        report.makespan
    } else {
        1.0
    };
    let scale = width / span;
    let height = top + lanes as f64 * lane_h + 70.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">",
        left + width + 20.0
    );
    let _ = writeln!(
        s,
        "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    let _ = writeln!(
        s,
        "<text x=\"{left}\" y=\"20\" font-size=\"13\">{}makespan {} · bubble {:.1}%</text>",
        if title.is_empty() {
            String::new()
        } else {
            format!("{} · ", escape(title))
        },
        fmt_num(report.makespan),
        report.bubble_fraction * 100.0
    );
    for r in 0..lanes {
        let y = top + r as f64 * lane_h;
        let _ = writeln!(
            s,
            "<text x=\"8\" y=\"{}\">rank {r}</text>",
            y + lane_h / 2.0 + 4.0
        );
        let _ = writeln!(
            s,
            "<rect x=\"{left}\" y=\"{y}\" width=\"{width}\" height=\"{}\" fill=\"#f4f4f4\"/>",
            lane_h - 4.0
        );
        for e in &report.events[r] {
            if !e.action.kind.is_compute() || e.end <= e.start {
                continue;
            }
            let x = left + e.start * scale;
            let w = (e.end - e.start) * scale;
            let _ = writeln!(
                s,
                "<rect x=\"{x:.2}\" y=\"{y}\" width=\"{w:.2}\" height=\"{}\" fill=\"{}\" stroke=\"white\" stroke-width=\"0.5\"><title>{}</title></rect>",
                lane_h - 4.0,
                colour(e.action.kind),
                e.action.explain()
            );
            if w >= 10.0 {
                let _ = writeln!(
                    s,
                    "<text x=\"{:.2}\" y=\"{}\" fill=\"white\" text-anchor=\"middle\">{}</text>",
                    x + w / 2.0,
                    y + lane_h / 2.0 + 2.0,
                    e.action.micro_batch
                );
            }
        }
    }
    // Time axis with about ten ticks.
    let axis_y = top + lanes as f64 * lane_h + 4.0;
    let _ = writeln!(
        s,
        "<line x1=\"{left}\" y1=\"{axis_y}\" x2=\"{}\" y2=\"{axis_y}\" stroke=\"black\"/>",
        left + width
    );
    let raw = span / 10.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|k| k * mag)
        .find(|&k| k >= raw)
        .unwrap_or(raw);
    let mut t = 0.0;
    while t <= span + 1e-9 {
        let x = left + t * scale;
        let _ = writeln!(
            s,
            "<line x1=\"{x:.2}\" y1=\"{axis_y}\" x2=\"{x:.2}\" y2=\"{}\" stroke=\"black\"/><text x=\"{x:.2}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            axis_y + 4.0,
            axis_y + 16.0,
            fmt_num(t)
        );
        t += step;
    }
    let legend_y = axis_y + 34.0;
    for (i, (kind, label)) in [
        (ActionKind::Forward, "F forward"),
        (ActionKind::BackwardInput, "B input grad"),
        (ActionKind::BackwardWeight, "W weight grad"),
        (ActionKind::FullBackward, "B+W fused backward"),
    ]
    .iter()
    .enumerate()
    {
        let x = left + i as f64 * 170.0;
        let _ = writeln!(
            s,
            "<rect x=\"{x}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{label}</text>",
            legend_y - 11.0,
            colour(*kind),
            x + 20.0,
            legend_y
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn fmt_num(x: f64) -> String {
    if (x - x.round()).abs() < 1e-9 {
        format!("{}", x.round())
    } else {
        format!("{x:.3}")
    }
}
