//! A heat map (a table of coloured cells with the number printed in each) with plotters'
//! bitmap backend, for haul-matrixbench: longhaul / best iperf3 per emulated path. Text is
//! drawn with the font `plot.rs` registers.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use crate::plot::init_font;

/// One cell of a heat map.
pub struct HeatCell {
    /// What sets the colour (None: not measured, drawn white).
    pub value: Option<f64>,
    /// Printed in the cell (one or two lines, split at '\n').
    pub text: String,
    /// Drawn grey with its text, whatever the value (e.g. a path that failed its check).
    pub greyed: bool,
}

/// Colour of a longhaul / reference ratio: reds and oranges below `goal`, greens from it on
/// (darker the further from it), so a cell's side of the goal shows at a glance.
pub fn ratio_colour(r: f64, goal: f64) -> RGBColor {
    let lerp = |a: (u8, u8, u8), b: (u8, u8, u8), t: f64| {
        let t = t.clamp(0.0, 1.0);
        let m = |x: u8, y: u8| (x as f64 + (y as f64 - x as f64) * t).round() as u8;
        RGBColor(m(a.0, b.0), m(a.1, b.1), m(a.2, b.2))
    };
    if r < goal {
        // 0 -> dark red, goal -> light orange.
        lerp((165, 0, 38), (253, 190, 120), r / goal)
    } else {
        // goal -> light green, goal + 0.2 and above -> dark green.
        lerp((200, 235, 160), (26, 140, 70), (r - goal) / 0.2)
    }
}

/// A table of coloured cells with row and column labels and a colour legend; the number of
/// each cell is printed in it. Used by haul-matrixbench (longhaul / best iperf3 per path).
pub fn heat_map(
    path: &Path,
    title: &str,
    rows: &[String],
    cols: &[String],
    cells: &[Vec<HeatCell>],
    goal: f64,
    legend: &str,
) -> Result<()> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    init_font().map_err(|e| anyhow!(e))?;
    let (label_w, cell_w, cell_h, top, bottom) = (300i32, 170i32, 40i32, 100i32, 90i32);
    let lw = 400i32;
    let w = (label_w + (cell_w * cols.len().max(1) as i32).max(lw + 40) + 20) as u32;
    let h = (top + cell_h * rows.len().max(1) as i32 + bottom) as u32;
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE)?;
    let centre = Pos::new(HPos::Center, VPos::Center);
    let left = Pos::new(HPos::Left, VPos::Center);
    root.draw(&Text::new(
        title.to_string(),
        (10, 22),
        TextStyle::from(("sans-serif", 20).into_font()).pos(left),
    ))?;
    for (j, c) in cols.iter().enumerate() {
        let x = label_w + cell_w * j as i32 + cell_w / 2;
        root.draw(&Text::new(
            c.clone(),
            (x, top - 18),
            TextStyle::from(("sans-serif", 16).into_font()).pos(centre),
        ))?;
    }
    for (i, r) in rows.iter().enumerate() {
        let y0 = top + cell_h * i as i32;
        root.draw(&Text::new(
            r.clone(),
            (10, y0 + cell_h / 2),
            TextStyle::from(("sans-serif", 15).into_font()).pos(left),
        ))?;
        for (j, cell) in cells
            .get(i)
            .map(|v| v.as_slice())
            .unwrap_or(&[])
            .iter()
            .enumerate()
        {
            let x0 = label_w + cell_w * j as i32;
            let fill = match (cell.greyed, cell.value) {
                (true, _) => RGBColor(200, 200, 200),
                (false, Some(v)) => ratio_colour(v, goal),
                (false, None) => WHITE,
            };
            root.draw(&Rectangle::new(
                [(x0, y0), (x0 + cell_w, y0 + cell_h)],
                fill.filled(),
            ))?;
            root.draw(&Rectangle::new(
                [(x0, y0), (x0 + cell_w, y0 + cell_h)],
                BLACK.mix(0.3),
            ))?;
            let lines: Vec<&str> = cell.text.lines().collect();
            let n = lines.len().max(1) as i32;
            for (k, l) in lines.iter().enumerate() {
                let size = if k == 0 { 17 } else { 12 };
                let y = y0 + cell_h * (2 * k as i32 + 1) / (2 * n);
                root.draw(&Text::new(
                    l.to_string(),
                    (x0 + cell_w / 2, y),
                    TextStyle::from(("sans-serif", size).into_font()).pos(centre),
                ))?;
            }
        }
    }
    // Legend: the colour scale from 0 to goal + 0.3, and the goal marked.
    let ly = top + cell_h * rows.len() as i32 + 25;
    let lx0 = label_w;
    let max = goal + 0.3;
    for k in 0..lw {
        let r = max * k as f64 / lw as f64;
        root.draw(&Rectangle::new(
            [(lx0 + k, ly), (lx0 + k + 1, ly + 18)],
            ratio_colour(r, goal).filled(),
        ))?;
    }
    for r in [0.0, 0.5, goal, 1.0, max] {
        let x = lx0 + (lw as f64 * r / max).round() as i32;
        root.draw(&Text::new(
            format!("{r:.2}"),
            (x, ly + 30),
            TextStyle::from(("sans-serif", 12).into_font()).pos(centre),
        ))?;
    }
    root.draw(&Text::new(
        legend.to_string(),
        (10, ly + 9),
        TextStyle::from(("sans-serif", 13).into_font()).pos(left),
    ))?;
    root.present()?;
    Ok(())
}
