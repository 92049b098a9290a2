//! `haul trace summary|plot`: reading traces made with `haul cp --trace` or an endpoint's
//! `--trace-dir` (the computation is `transfer::trace::summary`; this draws and prints).

use crate::args::{TracePlotArgs, TraceSummaryArgs};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use transfer::TransferError;
use transfer::trace::summary::{self, Series};

pub fn summary(a: TraceSummaryArgs) -> Result<u8, TransferError> {
    let lines = transfer::trace::read(&a.file)?;
    let s = summary::summarize(&lines);
    if a.json {
        crate::jsondoc::print_report(&s);
    } else {
        for line in s.to_string().lines() {
            out!("{line}");
        }
    }
    Ok(0)
}

pub fn plot(a: TracePlotArgs) -> Result<u8, TransferError> {
    let lines = transfer::trace::read(&a.file)?;
    let series = summary::series(&lines);
    if series.total_t_s.is_empty() {
        return Err(TransferError::usage(format!(
            "{}: no stream samples to plot",
            a.file.display()
        )));
    }
    init_font().map_err(TransferError::local)?;
    let size = (1200, 1100);
    let title = a.file.display().to_string();
    let failed =
        |e: String| TransferError::not_writable(format!("cannot draw {}: {e}", a.output.display()));
    match a.output.extension().and_then(|e| e.to_str()) {
        Some("svg") => {
            let root = SVGBackend::new(&a.output, size).into_drawing_area();
            draw(&root, &series, &title).map_err(failed)?;
            root.present().map_err(|e| failed(e.to_string()))?;
        }
        Some("png") => {
            let root = BitMapBackend::new(&a.output, size).into_drawing_area();
            draw(&root, &series, &title).map_err(failed)?;
            root.present().map_err(|e| failed(e.to_string()))?;
        }
        _ => {
            return Err(TransferError::usage(format!(
                "{}: the picture's name must end in .svg or .png",
                a.output.display()
            )));
        }
    }
    Ok(0)
}

/// Four panels sharing the time axis: throughput (each stream, and the total in black),
/// cwnd, RTT and retransmitted segments per sample, each stream in its own colour.
fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    s: &Series,
    title: &str,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(err)?;
    let panels = root.split_evenly((4, 1));
    let t_end = s.total_t_s.last().copied().unwrap_or(1.0).max(0.01);
    let max_of = |v: &mut dyn Iterator<Item = f64>| v.fold(0.0f64, f64::max).max(1e-9) * 1.05;
    type Pick = fn(&summary::StreamSeries) -> &Vec<f64>;
    let specs: [(&str, Pick, f64); 3] = [
        ("cwnd (MB)", |x| &x.cwnd_bytes, 1e6),
        ("RTT (ms)", |x| &x.rtt_ms, 1.0),
        ("retransmitted segments", |x| &x.retrans, 1.0),
    ];
    // Throughput.
    {
        let top = max_of(&mut s.total_bps.iter().map(|v| v / 1e6));
        let mut c = ChartBuilder::on(&panels[0])
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..t_end, 0.0..top)
            .map_err(err)?;
        c.configure_mesh()
            .x_desc("s")
            .y_desc("Mbit/s")
            .draw()
            .map_err(err)?;
        for (i, st) in s.streams.values().enumerate() {
            let colour = Palette99::pick(i).to_rgba();
            let pts = st.t_s.iter().zip(&st.rate_bps).map(|(t, r)| (*t, r / 1e6));
            c.draw_series(LineSeries::new(pts, colour)).map_err(err)?;
        }
        let total = s
            .total_t_s
            .iter()
            .zip(&s.total_bps)
            .map(|(t, r)| (*t, r / 1e6));
        c.draw_series(LineSeries::new(total, BLACK.stroke_width(2)))
            .map_err(err)?
            .label("total")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK));
        c.configure_series_labels()
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    for (panel, (name, pick, scale)) in panels[1..].iter().zip(specs) {
        let top = max_of(
            &mut s
                .streams
                .values()
                .flat_map(|x| pick(x).iter().map(|v| v / scale)),
        );
        let mut c = ChartBuilder::on(panel)
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..t_end, 0.0..top)
            .map_err(err)?;
        c.configure_mesh()
            .x_desc("s")
            .y_desc(name)
            .draw()
            .map_err(err)?;
        for (i, st) in s.streams.values().enumerate() {
            let colour = Palette99::pick(i).to_rgba();
            let pts = st.t_s.iter().zip(pick(st)).map(|(t, v)| (*t, v / scale));
            c.draw_series(LineSeries::new(pts, colour)).map_err(err)?;
        }
    }
    Ok(())
}

const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers DejaVu Sans for the plots' text (plotters measures and draws text through
/// ab_glyph, with no system font library); Err says what to install.
fn init_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let path = FONT_PATHS
            .iter()
            .find(|p| Path::new(p).exists())
            .ok_or("plots need DejaVuSans.ttf (apt-get install fonts-dejavu-core)")?;
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{path}: not a usable font"))
    })
    .clone()
}
